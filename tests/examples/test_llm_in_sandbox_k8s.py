"""LLM-in-Sandbox as Kubernetes Jobs, end to end: a real Controller (k8s runner) renders
`job-template.yaml` for four rollouts on a real Gateway and creates the Jobs on the loopback
Kubernetes API double, which runs each Job's container command as a local process with the rendered
environment — as the pod's non-root user (setpriv, when the tests run as root). So the real agent
runs in pod mode (`SANDBOX_ISOLATION=pod`, no bubblewrap) against the scripted model: a right
answer, a wrong one, a converted row whose answer is in its documents, and an attempt to read the
agent's environment (the attempt's key, the reference answer) that fails. `network-policy.yaml`
selects exactly those pods and lets them reach only the Gateway (and DNS); the image's Dockerfile is
hadolint clean. (The double neither enforces NetworkPolicy nor runs the image: the command runs on
this machine's network, from this checkout.)"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentlightning.aggregation import AggregationStats, aggregate_rollout
from agentlightning.client import GatewayClient
from agentlightning.schemas import Model
from tests.conftest import start_gateway
from tests.controller.helpers import wait_until
from tests.controller.k8s_helpers import FakeKubernetes, start_fake_kubernetes, start_k8s_controller
from tests.examples.k8s_example import check_dockerfile, check_egress_only_to_gateway_and_dns
from tests.examples.stack import EXAMPLES, EXAMPLES_PYTHON
from tests.examples.test_llm_in_sandbox import HERE, _code_for, _load, convert_public_rows
from tests.fakes.scripted_model import ScriptedChatModel, tool_call_text

TEMPLATE = (HERE / "job-template.yaml").read_text()
POLICY = yaml.safe_load((HERE / "network-policy.yaml").read_text())
KEY = "k8s-llm-in-sandbox-key"
POD_UID = 10001  # the Job's runAsUser
LEAK = (
    "env; echo ---; cat /proc/$PPID/environ; echo; cat /proc/$PPID/cmdline >/dev/null && echo cmdline-ok; "
    "head -c 64 /proc/$PPID/mem; ls /proc/$PPID/fd; echo end"
)


def _as_pod_user() -> list[str]:
    if os.geteuid() != 0:
        return []  # already an unprivileged user, as in the pod
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is needed to run the pod's command as its non-root user"
    return [setpriv, f"--reuid={POD_UID}", f"--regid={POD_UID}", "--clear-groups", "--"]


def _pod_folder(prefix: str) -> Path:
    """A folder the pod's user owns (pytest's own tmp folders are root-only when run as root)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    folder.chmod(0o755)
    if os.geteuid() == 0:
        os.chown(folder, POD_UID, POD_UID)
    return folder


def local_template(workspace: Path) -> str:
    """job-template.yaml as the double runs it here: the image's paths → this checkout's, the
    image's PYTHONPATH, the emptyDir → a folder of this rollout's; everything else unchanged."""
    command = json.dumps([*_as_pod_user(), str(EXAMPLES_PYTHON), str(HERE / "sandbox_agent.py")])
    replacements = {
        'command: ["python", "/app/examples/llm_in_sandbox/sandbox_agent.py"]': f"command: {command}",
        "workingDir: /workspace": f"workingDir: {workspace}",
        "- name: SANDBOX_WORKSPACE\n              value: /workspace": (
            f"- name: SANDBOX_WORKSPACE\n              value: {workspace}\n"
            f"            - name: PYTHONPATH\n              value: {EXAMPLES.parent}"
        ),
    }
    text = TEMPLATE
    for old, new in replacements.items():
        assert text.count(old) == 1, f"job-template.yaml changed: {old!r}"
        text = text.replace(old, new)
    return text


class PodPolicy:
    """Right answers by the same tool calls as the bubblewrap test; `wrong`: submit 42 at once;
    `leak`: first try to read the agent's environment, memory and descriptors, then solve it."""

    def __init__(self, wrong: str, leak: str) -> None:
        self.wrong, self.leak = wrong, leak

    def __call__(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        question = next(m["content"] for m in messages if m["role"] == "user")
        results = [m["content"] for m in messages if m["role"] == "tool"]
        if question == self.wrong:
            return tool_call_text("submit", {"answer": "42"})
        if question == self.leak and not results:
            return tool_call_text("shell", {"command": LEAK})
        if len(results) == (1 if question == self.leak else 0):
            tool, arguments = _code_for(question)
            return tool_call_text(tool, arguments)
        return tool_call_text("submit", {"answer": results[-1].strip().splitlines()[-1]})


@dataclass
class Ran:
    cluster: FakeKubernetes
    inputs: list[dict[str, Any]]
    workspaces: list[Path]
    jobs: list[dict[str, Any]]
    states: list[str]
    events: list[list[dict[str, Any]]]
    rows: list[int]  # training rows per rollout
    pod_logs: str


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory, examples_python: str) -> Iterator[Ran]:
    tmp = tmp_path_factory.mktemp("llm_in_sandbox_k8s")
    rows = [json.loads(line) for line in (HERE / "data" / "train.jsonl").read_text().splitlines()]
    documents = _pod_folder("agl-k8s-docs-")  # readable by the pod's user, as a mounted volume
    converted, out = convert_public_rows(documents)
    assert converted.returncode == 0, converted.stderr
    for folder in [documents, *documents.rglob("*")]:
        folder.chmod(0o755 if folder.is_dir() else 0o644)
    kestrel = next(r for line in out.read_text().splitlines() if (r := json.loads(line))["id"] == "kestrel")
    inputs = [
        next(r for r in rows if r["family"] == "long_context"),
        next(r for r in rows if r["family"] == "math"),
        next(r for r in rows if r["family"] == "data" and "most units" in r["question"]),
        kestrel,
    ]
    workspaces = [_pod_folder("agl-k8s-ws-") for _ in inputs]
    policy = PodPolicy(wrong=inputs[1]["question"], leak=inputs[2]["question"])
    cluster = start_fake_kubernetes(tmp)
    gateway = start_gateway(tmp, KEY)
    try:
        with ScriptedChatModel(policy) as model, GatewayClient(gateway.url, KEY) as client:
            client.register_models([Model(model="policy", endpoint=model.base_url)])
            controller = start_k8s_controller(
                cluster,
                gateway.url,
                KEY,
                tmp / "logs",
                gateway.url,
            )
            try:
                rollouts = client.create_rollouts(
                    [
                        {
                            "input": row,
                            "config": {"timeout_seconds": 300, "k8s": {"job_template": local_template(ws)}},
                        }
                        for row, ws in zip(inputs, workspaces, strict=True)
                    ]
                )
                ids = [r.rollout_id for r in rollouts]

                def finished() -> list[str] | None:
                    states = [client.get_rollout(i).rollout.status.state.value for i in ids]
                    return states if all(s in ("succeeded", "failed") for s in states) else None

                states = wait_until(finished, 360, "the four rollouts to finish")
                names = [client.get_rollout(i).rollout.status.k8s_job_name for i in ids]
                jobs = [(cluster.job(name, "agents") if name else None) or {} for name in names]
                events = [client.get_events_json(i, format="raw") for i in ids]
                rows = [
                    aggregate_rollout(
                        client.get_events_json(i, format="triplet"), i, "g", 0.0, stats=AggregationStats()
                    )
                    for i in ids
                ]
            finally:
                controller.stop()
        pod_logs = "\n".join(p.read_text(errors="replace") for p in sorted((tmp / "fake-k8s").glob("*.log")))
        yield Ran(cluster, inputs, workspaces, jobs, states, events, [len(r) for r in rows], pod_logs)
    finally:
        gateway.process.stop()
        cluster.process.stop()
        for folder in [documents, *workspaces]:
            shutil.rmtree(folder, ignore_errors=True)


def _tool_outputs(events: list[dict[str, Any]]) -> list[str]:
    calls = [e for e in events if e["event_type"] == "model_request"]
    return [m["content"] for m in calls[-1]["data"]["request"]["messages"] if m["role"] == "tool"]


@pytest.mark.process
def test_jobs_run_the_agent_in_pod_mode_and_reward_right_and_wrong(ran: Ran) -> None:
    assert ran.states == ["succeeded"] * 4, ran.pod_logs[-4000:]
    rewards = [[e["data"]["value"] for e in ev if e["event_type"] == "reward"] for ev in ran.events]
    assert rewards == [[1.0], [0.0], [1.0], [1.0]], ran.pod_logs[-4000:]
    assert ran.pod_logs.count("isolation=pod") == 4  # no bubblewrap: the pod is the sandbox
    calls = [sum(e["event_type"] == "model_request" for e in ev) for ev in ran.events]
    assert (calls, ran.rows) == ([2, 1, 3, 2], [1, 1, 1, 1])  # docs/examples.md
    for events in ran.events:
        for call in (e for e in events if e["event_type"] == "model_request"):
            response = call["data"]["response"]
            assert response["prompt_token_ids"] and response["choices"][0]["token_ids"]
    # the tools ran in the pod's workspace, on the task's real files, as the pod's user
    assert _tool_outputs(ran.events[0])[0] == f"[exit 0]\n{ran.inputs[0]['answer']}\n"
    assert _tool_outputs(ran.events[3])[0] == "[exit 0]\n1887\n"  # the converted row's documents
    assert (ran.workspaces[0] / "records.log").exists() and (ran.workspaces[3] / "history.txt").exists()
    if os.geteuid() == 0:
        assert (ran.workspaces[0] / "records.log").stat().st_uid == POD_UID


@pytest.mark.process
def test_the_models_commands_cannot_read_the_agents_secrets(ran: Ran) -> None:
    (job_env,) = [
        {e["name"]: e.get("value", "") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
        for job in ran.jobs[2:3]
    ]
    leaked = _tool_outputs(ran.events[2])[0]
    assert "end" in leaked and "cmdline-ok" in leaked  # the commands ran; /proc of the agent is there
    assert "Permission denied" in leaked  # environ, mem and fd belong to root: the agent is non-dumpable
    env_lines = leaked.split("---")[0].split("\n")[1:]
    assert {line.split("=")[0] for line in env_lines if "=" in line} <= {
        "PATH",
        "HOME",
        "LANG",
        "PWD",
        "SHLVL",
        "_",
    }
    for secret in (job_env["AGL_KEY"], job_env["ANSWER"], "AGL_EVENT_URL"):
        assert secret not in leaked, secret


@pytest.mark.process
def test_the_jobs_are_what_the_network_policy_confines(ran: Ran) -> None:
    for row, job in zip(ran.inputs, ran.jobs, strict=True):
        assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] == 300
        pod = job["spec"]["template"]
        labels = pod["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in POLICY["spec"]["podSelector"]["matchLabels"].items())
        spec = pod["spec"]
        assert spec["automountServiceAccountToken"] is False  # no cluster credentials in the pod
        assert (
            spec["securityContext"]["runAsNonRoot"] is True
            and spec["securityContext"]["runAsUser"] == POD_UID
        )
        (container,) = spec["containers"]
        assert container["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        }
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert {m["name"] for m in container["volumeMounts"]} == set(volumes) == {"workspace", "tmp"}
        assert all("emptyDir" in v for v in volumes.values())  # the only writable places
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["SANDBOX_ISOLATION"] == "pod"
        assert (env["TASK_FAMILY"], env["QUESTION"], env["TASK_DOCUMENTS"]) == (
            row["family"],
            row["question"],
            row["documents"],
        )
        assert env["AGL_KEY"] and env["AGL_KEY"] != KEY  # the attempt's scoped token, not the Gateway's key


def test_the_network_policy_admits_only_the_gateway_and_dns() -> None:
    check_egress_only_to_gateway_and_dns(POLICY, "llm-in-sandbox-agent")


def test_the_image_is_hadolint_clean_and_copies_what_exists() -> None:
    check_dockerfile(HERE)
    dockerfile = (HERE / "Dockerfile").read_text()
    assert "bubblewrap" not in dockerfile.split("FROM")[1] and "data/" not in dockerfile  # no answers in it


# --- the switch: SANDBOX_ISOLATION ---------------------------------------------------------------


@pytest.fixture(scope="module")
def agent() -> Any:
    return sys.modules.get("sandbox_agent") or _load("sandbox_agent")


def test_the_isolation_switch_is_explicit(
    agent: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("SANDBOX_ISOLATION", raising=False)
    assert agent.isolation() == "bwrap"  # the default: every command in bubblewrap
    monkeypatch.setenv("SANDBOX_ISOLATION", "pod")
    assert agent.isolation() == "pod"
    monkeypatch.setenv("SANDBOX_ISOLATION", "none")
    with pytest.raises(SystemExit, match="SANDBOX_ISOLATION='none': expected one of bwrap, pod"):
        agent.isolation()
    with pytest.raises(ValueError, match="isolation 'docker'"):
        agent.Tools(tmp_path, 5, 100, "docker")
    monkeypatch.delenv("SANDBOX_WORKSPACE", raising=False)
    with pytest.raises(SystemExit, match="needs SANDBOX_WORKSPACE"):
        agent.pod_workspace()
    (tmp_path / "left.txt").write_text("x")
    monkeypatch.setenv("SANDBOX_WORKSPACE", str(tmp_path))
    with pytest.raises(SystemExit, match="not empty"):
        agent.pod_workspace()


def test_pod_mode_runs_commands_in_the_workspace_with_a_cleared_environment(
    agent: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANSWER", "the-secret-answer")
    tools = agent.Tools(tmp_path, timeout=1, output_chars=4000, isolation="pod")
    assert tools.box is None
    assert tools.shell("pwd") == f"[exit 0]\n{tmp_path}\n"
    assert "the-secret" not in tools.shell("env") and "wrote 3 bytes" in tools.write_file("a.txt", "hi\n")
    assert tools.python("print(open('a.txt').read().strip())") == "[exit 0]\nhi\n"
    assert tools.shell("sleep 30 & sleep 30; echo never").startswith("[timed out]")  # its whole group
