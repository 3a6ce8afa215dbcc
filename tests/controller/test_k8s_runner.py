"""The Kubernetes runner end to end: a real Gateway, a real controller using the real kr8s client,
and the Kubernetes API double that runs each Job's container command as a local process."""

from __future__ import annotations

import math
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from agentlightning.client import GatewayClient
from agentlightning.procs import ManagedProcess
from agentlightning.server.auth import TokenSigner
from tests.conftest import RunningGateway, start_gateway
from tests.controller.helpers import GATEWAY_OVERRIDES, start_controller, wait_terminal, wait_until
from tests.controller.k8s_helpers import FakeKubernetes, job_template, start_fake_kubernetes

pytestmark = pytest.mark.process  # whole processes, waited on: not in `make test-fast`

KEY = "k8s-key"
K8S_SETTINGS = (
    "runner_type=k8s",
    "k8s_runner.poll_interval=0.5",
    "k8s_runner.stuck_pod_seconds=1",
    "k8s_runner.deadline_slack_seconds=5",
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeKubernetes]:
    fake = start_fake_kubernetes(tmp_path_factory.mktemp("k8s"))
    yield fake
    fake.process.stop()


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    gateway = start_gateway(tmp_path_factory.mktemp("gw"), KEY, *GATEWAY_OVERRIDES)
    yield gateway
    gateway.process.stop()


def agent_url(gw: RunningGateway) -> str:
    """The Gateway as pods reach it: a different spelling of the same address, to tell them apart."""
    return f"http://localhost:{urlsplit(gw.url).port}"


@pytest.fixture(scope="module")
def controller(
    gw: RunningGateway, cluster: FakeKubernetes, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ManagedProcess]:
    proc = start_controller(
        gw.url,
        KEY,
        tmp_path_factory.mktemp("ctl") / "logs",
        *K8S_SETTINGS,
        f"k8s_runner.kubeconfig={cluster.kubeconfig}",
        f"agl_server.agent_url={agent_url(gw)}",
        "max_attempts=2",
    )
    yield proc
    assert proc.alive(), f"the controller died:\n{proc.log_tail(60)}"
    proc.stop()


@pytest.fixture
def client(gw: RunningGateway, controller: ManagedProcess) -> Iterator[GatewayClient]:
    with GatewayClient(gw.url, KEY) as c:
        yield c


def create(
    client: GatewayClient, template: str, input: object, timeout: float = 60, is_train: bool = True
) -> str:
    rollout_id = f"k-{uuid.uuid4().hex[:10]}"
    config = {"timeout_seconds": timeout, "k8s": {"job_template": template}}
    client.create_rollouts(
        [{"rollout_id": rollout_id, "input": input, "config": config, "is_train": is_train}]
    )
    return rollout_id


def running_job(client: GatewayClient, cluster: FakeKubernetes, rollout_id: str) -> str:
    """The name of the rollout's Job once its pod runs."""

    def check() -> str | None:
        name = client.get_rollout(rollout_id).rollout.status.k8s_job_name
        pods = cluster.pods(name) if name else []
        return name if any(p["status"]["phase"] == "Running" for p in pods) else None

    return wait_until(check, 30, f"the Job of {rollout_id} to run")


def test_rollout_runs_as_a_job_and_reports_to_the_gateway(
    client: GatewayClient, cluster: FakeKubernetes, gw: RunningGateway
) -> None:
    question = 'what is "2+2"?\nanswer: four'  # quoting and newlines survive yaml_escape
    rollout_id = create(client, job_template(), {"question": question}, timeout=42.5)
    val_id = create(client, job_template(), {"question": 7}, is_train=False)
    done = wait_terminal(client, [rollout_id, val_id])
    status = done[rollout_id].status
    assert status.state == "succeeded", status.error_message
    attempt = status.last_attempt_id
    [reward] = client.get_events(rollout_id, event_type="reward")
    assert reward.attempt_id == attempt and reward.data["question"] == question
    assert (
        reward.data["base_url"]
        == f"{agent_url(gw)}/proxy/rollout/{rollout_id}/attempt/{attempt}/mode/train/openai/v1"
    )
    [val_reward] = client.get_events(val_id, event_type="reward")
    assert val_reward.data["question"] == "7" and "/mode/val/" in val_reward.data["base_url"]

    job = cluster.job(status.k8s_job_name or "")
    assert job is not None
    labels = job["metadata"]["labels"]
    assert labels["app.kubernetes.io/managed-by"] == "agentlightning" and labels["team"] == "rl"
    assert labels["agentlightning.io/rollout-id"] == rollout_id
    assert labels["agentlightning.io/attempt-id"] == attempt
    spec = job["spec"]
    assert spec["backoffLimit"] == 0 and spec["ttlSecondsAfterFinished"] == 1200
    assert spec["activeDeadlineSeconds"] == math.ceil(42.5)
    assert spec["template"]["spec"]["restartPolicy"] == "Never"
    env = {e["name"]: e.get("value") for e in spec["template"]["spec"]["containers"][0]["env"]}
    assert env["AGL_EVENT_URL"].startswith(agent_url(gw))
    # The pod got a token for its own attempt, signed by the Gateway, not the controller's key.
    signed = TokenSigner.from_config(KEY, "").verify(env["AGL_KEY"])
    assert env["AGL_KEY"] != KEY and signed is not None and signed[:2] == (rollout_id, attempt)
    assert any(c["type"] == "Complete" for c in job["status"]["conditions"])


def test_agent_failure_reports_exit_code_and_log_tail_without_retry(client: GatewayClient) -> None:
    rollout_id = create(client, job_template(), {"question": "q", "exit_code": 3})
    status = wait_terminal(client, [rollout_id])[rollout_id].status
    assert status.state == "failed"
    message = status.error_message or ""
    assert "BackoffLimitExceeded" in message and "container agent exited with code 3" in message
    assert "bad thing happened" in message and "agent starting: q" in message
    assert (status.last_attempt_id or "").startswith("attempt-1-")  # max_attempts=2, but not retried
    assert outcomes(client, rollout_id) == {status.last_attempt_id: "agent_error"}


def outcomes(client: GatewayClient, rollout_id: str) -> dict[str | None, str | None]:
    """Each attempt's outcome, as the Gateway recorded it (docs/reliability.md)."""
    return {a.attempt_id: a.outcome for a in client.get_rollout(rollout_id).attempt_details}


def test_a_pod_oomkilled_at_its_memory_limit_is_pod_lost_retried_and_never_an_agent_error(
    client: GatewayClient,
) -> None:
    """The container allocates 200 MB under a 64Mi limit: the double's OOM killer (the cgroup's)
    kills it, the pod reports OOMKilled/137, and both attempts (max_attempts=2) are pod_lost."""
    rollout_id = create(client, job_template(memory_limit="64Mi"), {"question": "q", "allocate_mb": 200})
    status = wait_terminal(client, [rollout_id], timeout=60)[rollout_id].status
    assert status.state == "failed"
    assert "(OOMKilled)" in (status.error_message or "") and "code 137" in (status.error_message or "")
    assert set(outcomes(client, rollout_id).values()) == {"pod_lost"}


def test_invalid_job_spec_fails_with_the_api_message(client: GatewayClient) -> None:
    rollout_id = create(client, job_template(container="Agent_1"), {"question": "q"})
    status = wait_terminal(client, [rollout_id])[rollout_id].status
    assert status.state == "failed"
    assert "Kubernetes rejected Job" in (status.error_message or "")
    assert 'spec.template.spec.containers[0].name: Invalid value: "Agent_1"' in (status.error_message or "")


@pytest.mark.parametrize(
    ("template", "message"),
    [
        (job_template() + "---\n" + job_template(), "must render exactly one Job; it rendered 2 documents"),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: x}",
            "must render a batch/v1 Job; it rendered kind='Pod'",
        ),
        (job_template().replace("input.question", "input.nope"), "has no attribute 'nope'"),
        ("{% for %}", "job_template line 1"),
        ("apiVersion: batch/v1\nkind: Job\nspec: {}", "needs spec.template.spec.containers"),
    ],
)
def test_bad_templates_fail_with_a_clear_message(client: GatewayClient, template: str, message: str) -> None:
    rollout_id = create(client, template, {"question": "q"})
    status = wait_terminal(client, [rollout_id])[rollout_id].status
    assert status.state == "failed" and message in (status.error_message or ""), status.error_message


def test_rollout_without_a_job_template_fails(client: GatewayClient) -> None:
    rollout_id = f"k-{uuid.uuid4().hex[:10]}"
    client.create_rollouts([{"rollout_id": rollout_id, "input": 1}])
    status = wait_terminal(client, [rollout_id])[rollout_id].status
    assert status.state == "failed" and "config.k8s.job_template" in (status.error_message or "")


def test_image_pull_failure_fails_fast_and_removes_the_job(
    client: GatewayClient, cluster: FakeKubernetes
) -> None:
    rollout_id = create(
        client, job_template(image="registry.invalid/agent:1"), {"question": "q"}, timeout=600
    )
    status = wait_terminal(client, [rollout_id], timeout=30)[rollout_id].status  # the deadline is 10 minutes
    assert status.state == "failed"
    assert "cannot start: container agent: " in (status.error_message or "")
    assert "ErrImagePull" in (status.error_message or "") or "ImagePullBackOff" in (
        status.error_message or ""
    )
    wait_until(lambda: cluster.job(status.k8s_job_name or "") is None, 10, "the Job to be deleted")


def test_missing_secret_fails_fast(client: GatewayClient) -> None:
    secret_env = "        - name: TOKEN\n          valueFrom:\n            secretKeyRef: {name: agent-token, key: token}\n"
    rollout_id = create(client, job_template(extra_env=secret_env), {"question": "q"}, timeout=600)
    status = wait_terminal(client, [rollout_id], timeout=30)[rollout_id].status
    assert status.state == "failed"
    assert 'CreateContainerConfigError: secret "agent-token" not found' in (status.error_message or "")


def test_job_deleted_while_running_fails_the_rollout(client: GatewayClient, cluster: FakeKubernetes) -> None:
    rollout_id = create(client, job_template(), {"question": "q", "sleep": 30})
    cluster.delete_job(running_job(client, cluster, rollout_id))
    status = wait_terminal(client, [rollout_id])[rollout_id].status
    assert status.state == "failed" and "was deleted while the rollout was running" in (
        status.error_message or ""
    )


def test_api_errors_on_create_are_retried(client: GatewayClient, cluster: FakeKubernetes) -> None:
    cluster.fault("POST", r"/apis/batch/v1/namespaces/default/jobs$", 500, times=2)
    before = sum(r.startswith("POST ") for r in cluster.requests())
    rollout_id = create(client, job_template(), {"question": "q"})
    status = wait_terminal(client, [rollout_id])[rollout_id].status
    assert status.state == "succeeded", status.error_message
    assert sum(r.startswith("POST ") for r in cluster.requests()) - before == 3


def test_evicted_pod_is_retried_as_a_new_attempt(client: GatewayClient, cluster: FakeKubernetes) -> None:
    rollout_id = create(client, job_template(), {"question": "q", "sleep_first": 30})
    first_job = running_job(client, cluster, rollout_id)
    first_attempt = client.get_rollout(rollout_id).rollout.status.last_attempt_id
    assert cluster.evict(first_job)
    status = wait_terminal(client, [rollout_id])[rollout_id].status
    assert status.state == "succeeded", status.error_message
    assert status.last_attempt_id != first_attempt and (status.last_attempt_id or "").startswith("attempt-2-")
    assert status.k8s_job_name != first_job
    assert [e.attempt_id for e in client.get_events(rollout_id, event_type="reward")] == [
        status.last_attempt_id
    ]
    assert outcomes(client, rollout_id) == {first_attempt: "pod_lost", status.last_attempt_id: "ok"}


def test_timeout_becomes_the_job_deadline(client: GatewayClient) -> None:
    rollout_id = create(client, job_template(), {"question": "q", "sleep": 30}, timeout=1)
    status = wait_terminal(client, [rollout_id])[rollout_id].status
    assert status.state == "failed"
    assert "timed out" in (status.error_message or "") and "activeDeadlineSeconds=1" in (
        status.error_message or ""
    )
    assert outcomes(client, rollout_id) == {status.last_attempt_id: "timeout"}


def test_restart_adopts_running_jobs_and_fails_lost_ones(tmp_path: Path, cluster: FakeKubernetes) -> None:
    """Own Gateway and namespace: the module's controller must not see these rollouts. Full reads
    only every minute: what the controller learns here, it learns from its watch."""
    gateway = start_gateway(tmp_path, KEY, *GATEWAY_OVERRIDES)
    settings = (
        *K8S_SETTINGS,
        f"k8s_runner.kubeconfig={cluster.kubeconfig}",
        "k8s_runner.namespace=agents",
        "k8s_runner.poll_interval=60",
    )
    controllers: list[ManagedProcess] = []
    try:
        controllers.append(start_controller(gateway.url, KEY, tmp_path / "logs", *settings))
        with GatewayClient(gateway.url, KEY) as client:
            kept = create(client, job_template(), {"question": "kept", "sleep": 3})
            lost = create(client, job_template(), {"question": "lost", "sleep": 30})

            def names() -> dict[str, str] | None:
                found = {r: client.get_rollout(r).rollout.status.k8s_job_name for r in (kept, lost)}
                ready = all(
                    n and any(p["status"]["phase"] == "Running" for p in cluster.pods(n, "agents"))
                    for n in found.values()
                )
                return found if ready else None  # type: ignore[return-value]

            jobs = wait_until(names, 30, "both Jobs to run")
            attempts = {r: client.get_rollout(r).rollout.status.last_attempt_id for r in (kept, lost)}
            first = controllers[0]
            os.kill(first.pid, signal.SIGTERM)  # a graceful stop leaves Jobs running for the next one
            assert first.proc is not None and first.proc.wait(20) == 0, first.log_tail()
            assert {client.get_rollout(r).rollout.status.state.value for r in (kept, lost)} == {"running"}
            cluster.delete_job(jobs[lost], "agents")
            controllers.append(start_controller(gateway.url, KEY, tmp_path / "logs", *settings))
            done = wait_terminal(client, [kept, lost])
        assert done[kept].status.state == "succeeded", done[kept].status.error_message
        assert done[kept].status.last_attempt_id == attempts[kept]  # adopted, not restarted
        assert done[lost].status.state == "failed"
        assert f"no live agent for attempt {attempts[lost]}" in (done[lost].status.error_message or "")
    finally:
        for proc in controllers:
            proc.stop()
        gateway.process.stop()
