"""Calc-X as a Kubernetes Job: a real Controller (k8s runner) renders `job-template.yaml` for
sample rows and creates the Job on the loopback Kubernetes API double; the Job has the agent
image, its command, the environment (escaped right for questions with quotes, colons and
newlines) and the requests the template asks for. (The double cannot run the image; a real
cluster would: see run_minikube.sh.)"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from agentlightning.client import GatewayClient
from tests.conftest import RunningGateway, start_gateway
from tests.controller.helpers import wait_until
from tests.controller.k8s_helpers import FakeKubernetes, start_fake_kubernetes, start_k8s_controller
from tests.examples.stack import EXAMPLES

TEMPLATE = (EXAMPLES / "calc_x" / "job-template.yaml").read_text()
SAMPLE = [
    json.loads(line) for line in (EXAMPLES / "calc_x" / "data" / "sample.jsonl").read_text().splitlines()
]
KEY = "k8s-example-key"
HOSTILE = {
    "id": "hostile",
    "question": 'He said: "it\'s 3: 4"\nkey: value\n- item\n  {{ job_name }} # not a comment \\n \u00b0 \ttab',
    "result": '3/4: "x"\n',
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeKubernetes, RunningGateway]]:
    tmp = tmp_path_factory.mktemp("calc_x_k8s")
    cluster = start_fake_kubernetes(tmp)
    gateway = start_gateway(tmp, KEY)
    controller = start_k8s_controller(
        cluster,
        gateway.url,
        KEY,
        tmp / "logs",
        "http://host.minikube.internal:8181",
    )
    try:
        yield cluster, gateway
    finally:
        controller.stop()
        gateway.process.stop()
        cluster.process.stop()


@pytest.mark.parametrize(
    "row", [SAMPLE[0], SAMPLE[5], HOSTILE], ids=["fraction", "multiple-choice", "hostile"]
)
def test_the_job_from_the_template(stack: tuple[FakeKubernetes, RunningGateway], row: dict) -> None:
    cluster, gateway = stack
    with GatewayClient(gateway.url, KEY) as client:
        (rollout,) = client.create_rollouts(
            [{"input": row, "config": {"timeout_seconds": 300, "k8s": {"job_template": TEMPLATE}}}]
        )
        name = wait_until(
            lambda: client.get_rollout(rollout.rollout_id).rollout.status.k8s_job_name, 60, "the Job's name"
        )
        status = client.get_rollout(rollout.rollout_id).rollout.status
    job = wait_until(lambda: cluster.job(name, "agents"), 30, f"Job {name}")
    assert status.error_message is None or "template" not in status.error_message
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["activeDeadlineSeconds"] == 300
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    (container,) = pod["containers"]
    assert container["image"] == "agl-calc-x:latest"
    assert container["command"] == ["python", "/app/calc_agent.py"]
    assert container["resources"]["requests"] == {"cpu": "200m", "memory": "256Mi"}
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["QUESTION"] == row["question"]  # byte for byte: quotes, colons, newlines, braces
    assert env["RESULT"] == row["result"]
    assert env["AGL_KEY"]
    base = f"http://host.minikube.internal:8181/proxy/rollout/{rollout.rollout_id}/attempt/"
    assert env["AGL_OPENAI_BASE_URL"].startswith(base) and env["AGL_OPENAI_BASE_URL"].endswith(
        "/mode/train/openai/v1"
    )
    assert env["AGL_EVENT_URL"].startswith(
        f"http://host.minikube.internal:8181/api/rollouts/{rollout.rollout_id}/"
    )


def test_the_image_command_runs_the_agent_module() -> None:
    """The Job's command names the file the Dockerfile copies, and the agent class the local runner uses."""
    dockerfile = (EXAMPLES / "calc_x" / "Dockerfile").read_text()
    assert (
        "COPY examples/calc_x/calc_agent.py examples/calc_x/eval_utils.py examples/calc_x/check_calculator.py /app/"
        in dockerfile
    )
    assert "COPY agentlightning/__init__.py agentlightning/agent_events.py /app/agentlightning/" in dockerfile
    assert "python /app/check_calculator.py" in dockerfile
    assert (
        'if __name__ == "__main__":\n    CalcAgent().run()'
        in (EXAMPLES / "calc_x" / "calc_agent.py").read_text()
    )
