"""examples/swe as Kubernetes Jobs: a real Controller (k8s runner) renders `job-template.yaml` for three
tasks of the bank and creates the Jobs on the loopback Kubernetes API double; `network-policy.yaml`
selects exactly those pods and lets them reach only the Gateway (and DNS); the image's Dockerfile is
hadolint clean. (The double neither runs the image nor enforces NetworkPolicy.)"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

import pytest
import yaml

from agentlightning.client import GatewayClient
from examples.swe.bank import make_task
from tests.conftest import RunningGateway, start_gateway
from tests.controller.helpers import wait_until
from tests.controller.k8s_helpers import FakeKubernetes, start_fake_kubernetes, start_k8s_controller
from tests.examples.k8s_example import check_dockerfile, check_egress_only_to_gateway_and_dns
from tests.examples.stack import EXAMPLES

SWE = EXAMPLES / "swe"
TEMPLATE = (SWE / "job-template.yaml").read_text()
POLICY = yaml.safe_load((SWE / "network-policy.yaml").read_text())
KEY = "k8s-swe-key"
TASKS = [make_task(1, 0), make_task(2, 0), make_task(3, 0)]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeKubernetes, RunningGateway]]:
    tmp = tmp_path_factory.mktemp("swe_k8s")
    cluster = start_fake_kubernetes(tmp)
    gateway = start_gateway(tmp, KEY)
    controller = start_k8s_controller(
        cluster,
        gateway.url,
        KEY,
        tmp / "logs",
        "http://agl-server.agl.svc:8181",
    )
    try:
        yield cluster, gateway
    finally:
        controller.stop()
        gateway.process.stop()
        cluster.process.stop()


def _job_name(client: GatewayClient, rollout_id: str) -> str | None:
    return client.get_rollout(rollout_id).rollout.status.k8s_job_name


def _selected(labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in POLICY["spec"]["podSelector"]["matchLabels"].items())


def test_three_tasks_render_to_jobs_the_network_policy_confines(
    stack: tuple[FakeKubernetes, RunningGateway],
) -> None:
    cluster, gateway = stack
    with GatewayClient(gateway.url, KEY) as client:
        rollouts = client.create_rollouts(
            [
                {
                    "input": {"task_id": t.instance_id},
                    "config": {"timeout_seconds": 900, "k8s": {"job_template": TEMPLATE}},
                }
                for t in TASKS
            ]
        )
        names = [wait_until(partial(_job_name, client, r.rollout_id), 60, "a Job name") for r in rollouts]
    assert len(set(names)) == 3
    for task, name in zip(TASKS, names, strict=True):
        job = wait_until(partial(cluster.job, name, "agents"), 30, f"Job {name}")
        assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] == 900
        pod = job["spec"]["template"]
        assert _selected(pod["metadata"]["labels"])  # the NetworkPolicy applies to this pod
        assert pod["spec"]["automountServiceAccountToken"] is False  # no cluster credentials in the pod
        (container,) = pod["spec"]["containers"]
        assert container["image"] == "agl-swe:latest"
        assert container["command"] == ["python", "-m", "examples.swe.mini_agent"]
        assert container["securityContext"]["runAsNonRoot"] is True
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["TASK_ID"] == task.instance_id
        assert env["AGL_OPENAI_BASE_URL"].startswith("http://agl-server.agl.svc:8181/proxy/rollout/")
        assert env["AGL_KEY"] and env["AGL_KEY"] != KEY  # the attempt's scoped token, not the Gateway's key


def test_the_network_policy_admits_only_the_gateway_and_dns() -> None:
    check_egress_only_to_gateway_and_dns(POLICY, "swe-agent")


def test_the_image_is_hadolint_clean_and_copies_what_exists() -> None:
    check_dockerfile(SWE)


def test_the_host_gateway_policy_admits_one_address_and_refuses_anything_wider() -> None:
    """run_minikube.sh's policy (examples/swe/policy.py): the Gateway on the host as one address."""
    from examples.swe.policy import host_gateway_policy

    assert host_gateway_policy("fd00::1", 9000)["spec"]["egress"][0] == {
        "to": [{"ipBlock": {"cidr": "fd00::1/128"}}],
        "ports": [{"protocol": "TCP", "port": 9000}],
    }
    for address, port in (("10.0.0.0/8", 8181), ("0.0.0.0/0", 8181), ("gateway", 8181), ("10.0.0.1", 0)):
        with pytest.raises(ValueError):
            host_gateway_policy(address, port)
