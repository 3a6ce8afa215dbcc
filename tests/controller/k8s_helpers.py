"""The Kubernetes API double as a process, a kubeconfig for it, and Job templates for tests."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from agentlightning.launch import Service
from agentlightning.procs import ManagedProcess, free_port
from tests.controller.helpers import REPO, start_controller

TOKEN = "fake-cluster-token"

# The agent every test Job runs: a few lines of stdlib Python, like a small container image.
AGENT_CODE = """
import json, os, sys, time, urllib.request
print("agent starting:", os.environ["QUESTION"], flush=True)
if "/attempt/attempt-1-" in os.environ["AGL_EVENT_URL"]:
    time.sleep(float(os.environ.get("SLEEP_FIRST", "0")))
time.sleep(float(os.environ.get("SLEEP", "0")))
if int(os.environ.get("ALLOCATE_MB", "0")):  # past its memory limit: the OOM killer's
    hog = b"x" * (int(os.environ["ALLOCATE_MB"]) << 20)  # written, so resident
    time.sleep(60)
code = int(os.environ.get("EXIT_CODE", "0"))
if code:
    print("bad thing happened", file=sys.stderr, flush=True)
    sys.exit(code)
data = {"value": 1.0, "question": os.environ["QUESTION"], "base_url": os.environ["AGL_OPENAI_BASE_URL"]}
request = urllib.request.Request(
    os.environ["AGL_EVENT_URL"],
    data=json.dumps({"event_type": "reward", "data": data}).encode(),
    headers={"Content-Type": "application/json", "Authorization": "Bearer " + os.environ["AGL_KEY"]},
)
urllib.request.urlopen(request, timeout=30).read()
"""


def job_template(
    image: str = "python:3.11-slim", container: str = "agent", extra_env: str = "", memory_limit: str = ""
) -> str:
    """A Job template as a user writes it (Jinja variables, the yaml_escape filter)."""
    resources = (
        f"\n        resources:\n          limits:\n            memory: {memory_limit}" if memory_limit else ""
    )
    return f"""
apiVersion: batch/v1
kind: Job
metadata:
  name: {{{{ job_name }}}}
  labels:
    team: rl
spec:
  template:
    metadata:
      labels:
        team: rl
    spec:
      containers:
      - name: {container}
        image: {image}{resources}
        command: [{json.dumps(sys.executable)}, "-c", {json.dumps(AGENT_CODE)}]
        env:
        - name: QUESTION
          value: {{{{ input.question | yaml_escape }}}}
        - name: EXIT_CODE
          value: {{{{ input.exit_code | default(0) | yaml_escape }}}}
        - name: SLEEP
          value: {{{{ input.sleep | default(0) | yaml_escape }}}}
        - name: SLEEP_FIRST
          value: {{{{ input.sleep_first | default(0) | yaml_escape }}}}
        - name: ALLOCATE_MB
          value: {{{{ input.allocate_mb | default(0) | yaml_escape }}}}
{extra_env}"""


@dataclass
class FakeKubernetes:
    url: str
    kubeconfig: Path
    process: ManagedProcess

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {TOKEN}"}, trust_env=False)

    def job(self, name: str, namespace: str = "default") -> dict[str, Any] | None:
        with self.http() as http:
            response = http.get(f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}")
        return response.json() if response.status_code == 200 else None

    def pods(self, job_name: str, namespace: str = "default") -> list[dict[str, Any]]:
        with self.http() as http:
            response = http.get(
                f"/api/v1/namespaces/{namespace}/pods", params={"labelSelector": f"job-name={job_name}"}
            )
        return response.json()["items"]

    def delete_job(self, name: str, namespace: str = "default") -> None:
        with self.http() as http:
            http.request(
                "DELETE",
                f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}",
                json={"propagationPolicy": "Background"},
            ).raise_for_status()

    def fault(self, method: str, path: str, status: int, times: int) -> None:
        with self.http() as http:
            http.post(
                "/_fake/faults", json={"method": method, "path": path, "status": status, "times": times}
            )

    def evict(self, job_name: str, namespace: str = "default") -> bool:
        with self.http() as http:
            return (
                http.post("/_fake/evict", json={"namespace": namespace, "job": job_name}).status_code == 200
            )

    def requests(self) -> list[str]:
        with self.http() as http:
            return http.get("/_fake/requests").json()


def start_fake_kubernetes(tmp_path: Path) -> FakeKubernetes:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    workdir = tmp_path / "fake-k8s"
    argv = [
        sys.executable,
        "-m",
        "tests.fakes.k8s_api",
        f"--port={port}",
        f"--token={TOKEN}",
        f"--workdir={workdir}",
        "--grace=0.5",
        "--namespaces=agents",
    ]
    process = ManagedProcess("fake-k8s", argv, tmp_path / "fake-k8s.log", cwd=REPO).start()
    try:
        process.wait_http_ok(f"{url}/version")
    except Exception:
        process.stop()
        raise
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        f"""apiVersion: v1
kind: Config
clusters:
- name: fake
  cluster:
    server: {url}
users:
- name: tester
  user:
    token: {TOKEN}
contexts:
- name: fake
  context:
    cluster: fake
    user: tester
    namespace: default
current-context: fake
"""
    )
    return FakeKubernetes(url, kubeconfig, process)


def start_k8s_controller(
    cluster: FakeKubernetes, gateway_url: str, key: str, log_dir: Path, agent_url: str, *overrides: str
) -> Service:
    """A real Controller with the Kubernetes runner on the double, in namespace `agents`; the
    agents reach the Gateway at `agent_url` (what the cluster's pods would see)."""
    return start_controller(
        gateway_url,
        key,
        log_dir,
        "runner_type=k8s",
        f"k8s_runner.kubeconfig={cluster.kubeconfig}",
        "k8s_runner.namespace=agents",
        "k8s_runner.poll_interval=0.5",
        f"agl_server.agent_url={agent_url}",
        *overrides,
    )
