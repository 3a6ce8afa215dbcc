"""The Kubernetes API double behaves like the real API where the controller depends on it."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Iterator
from functools import partial
from pathlib import Path

import httpx
import kr8s
import kr8s.asyncio
import pytest
from kr8s.asyncio.objects import Job, Pod

from tests.controller.helpers import file_text, pid_alive, pid_gone, wait_until
from tests.controller.k8s_helpers import FakeKubernetes, start_fake_kubernetes
from tests.fakes.k8s_api import matches_fields, matches_labels

pytestmark = pytest.mark.process  # whole processes, waited on: not in `make test-fast`


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeKubernetes]:
    cluster = start_fake_kubernetes(tmp_path_factory.mktemp("fake-k8s"))
    yield cluster
    cluster.process.stop()


@pytest.fixture
async def api(fake: FakeKubernetes) -> AsyncIterator[kr8s.asyncio.Api]:
    client = await kr8s.asyncio.api(kubeconfig=str(fake.kubeconfig))
    yield client
    session = getattr(client, "_session", None)  # kr8s has no public close; each test has its own loop
    if session is not None:
        await session.aclose()


def job(name: str, code: str = "print('hi')", **spec: object) -> dict:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {"suite": "fake", "name": name}},
        "spec": {
            "backoffLimit": 0,
            **spec,
            "template": {
                "metadata": {"labels": {"suite": "fake"}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "python", "command": [sys.executable, "-c", code]}],
                },
            },
        },
    }


async def conditions(api: kr8s.asyncio.Api, name: str, want: str) -> dict:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        obj = Job({"metadata": {"name": name, "namespace": "default"}}, api=api)
        await obj.refresh()
        found = [c for c in obj.raw.get("status", {}).get("conditions", []) if c["type"] == want]
        if found:
            return obj.raw.to_dict()
        await asyncio.sleep(0.05)
    raise AssertionError(f"{name} never got condition {want}")


def test_selectors() -> None:
    labels = {"app": "a", "tier": "x"}
    assert matches_labels(labels, "app=a,tier==x") and matches_labels(labels, "app,!missing")
    assert matches_labels(labels, "tier in (x, y),app notin (b)") and not matches_labels(
        labels, "tier in (y)"
    )
    assert not matches_labels(labels, "app!=a") and not matches_labels(labels, "missing")
    obj = {"metadata": {"name": "n", "namespace": "default"}}
    assert matches_fields(obj, "metadata.name=n,") and not matches_fields(obj, "metadata.name!=n")


def test_discovery_and_auth(fake: FakeKubernetes) -> None:
    with httpx.Client(base_url=fake.url, trust_env=False) as anonymous:
        assert anonymous.get("/version").json()["gitVersion"] == "v1.31.0"
        denied = anonymous.get("/apis/batch/v1/namespaces/default/jobs")
        assert denied.status_code == 401 and denied.json()["kind"] == "Status"
    with fake.http() as http:
        assert http.get("/api").json()["versions"] == ["v1"]
        assert [g["name"] for g in http.get("/apis").json()["groups"]] == ["batch"]
        assert "jobs" in [r["name"] for r in http.get("/apis/batch/v1").json()["resources"]]


async def test_job_runs_its_command_and_reports_like_the_job_controller(
    api: kr8s.asyncio.Api, fake: FakeKubernetes
) -> None:
    assert await api.lookup_kind("jobs") == ("job.batch/v1", "jobs", True)
    created = Job(job("ok", "import os; print('hello', os.environ['HOSTNAME'])"), api=api)
    await created.create()
    raw = await conditions(api, "ok", "Complete")
    status = raw["status"]
    assert status["succeeded"] == 1 and status["active"] == 0 and "completionTime" in status
    assert [c["type"] for c in status["conditions"]] == ["SuccessCriteriaMet", "Complete"]
    [pod] = [p async for p in api.get("pods", namespace="default", label_selector={"job-name": "ok"})]
    assert isinstance(pod, Pod)
    assert pod.raw["metadata"]["ownerReferences"][0]["name"] == "ok"
    assert pod.raw["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    assert [line async for line in pod.logs()] == [f"hello {pod.name}"]
    with pytest.raises(kr8s.ServerError) as conflict:
        await Job(job("ok"), api=api).create()
    assert conflict.value.response is not None and conflict.value.response.status_code == 409


async def test_backoff_limit_creates_new_pods_then_fails(api: kr8s.asyncio.Api) -> None:
    await Job(job("retry", "raise SystemExit(2)", backoffLimit=1), api=api).create()
    raw = await conditions(api, "retry", "Failed")
    assert raw["status"]["failed"] == 2
    assert {c["type"]: c["reason"] for c in raw["status"]["conditions"]} == {
        "FailureTarget": "BackoffLimitExceeded",
        "Failed": "BackoffLimitExceeded",
    }
    pods = [p async for p in api.get("pods", namespace="default", label_selector={"job-name": "retry"})]
    assert len(pods) == 2


async def test_delete_without_propagation_orphans_the_pod(
    api: kr8s.asyncio.Api, fake: FakeKubernetes, tmp_path: Path
) -> None:
    for name, policy in (("orphan", None), ("background", "Background")):
        pid_file = tmp_path / name
        code = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
        await Job(job(name, code), api=api).create()
        pid = int(wait_until(partial(file_text, pid_file), 20, "the pod to run"))
        await Job({"metadata": {"name": name, "namespace": "default"}}, api=api).delete(
            propagation_policy=policy
        )
        if policy is None:
            await asyncio.sleep(0.5)
            [orphan] = fake.pods(name)  # the pod lives on (labels kept), owned by nobody
            assert pid_alive(pid) and orphan["metadata"]["ownerReferences"] == []
            with fake.http() as http:
                http.delete(f"/api/v1/namespaces/default/pods/{orphan['metadata']['name']}")
        wait_until(partial(pid_gone, pid), 10, "the pod's process to stop")


async def test_watch_resumes_from_a_resource_version_and_filters_by_label(api: kr8s.asyncio.Api) -> None:
    since = None
    with_label = {"name": "watched"}
    events: list[tuple[str, str]] = []

    async def follow() -> None:
        async for event, obj in api.watch("jobs", namespace="default", label_selector=with_label):
            events.append((event, obj.name))
            if any(c["type"] == "Complete" for c in obj.raw.get("status", {}).get("conditions", [])):
                return

    await Job(job("unwatched"), api=api).create()
    await Job(job("watched"), api=api).create()
    await asyncio.wait_for(follow(), 20)
    assert events[0] == ("ADDED", "watched") and {n for _, n in events} == {"watched"}
    async with api.call_api("GET", version="batch/v1", url="jobs", namespace="default") as response:
        since = response.json()["metadata"]["resourceVersion"]
    await Job({"metadata": {"name": "watched", "namespace": "default"}}, api=api).delete(
        propagation_policy="Background"
    )
    seen = []
    async for event, obj in api.watch("jobs", namespace="default", label_selector=with_label, since=since):
        seen.append((event, obj.name))
        break
    assert seen == [("DELETED", "watched")]


def test_list_pages_with_continue(fake: FakeKubernetes) -> None:
    with fake.http() as http:
        # Two Jobs of its own: the ones earlier tests made may be finished and deleted by now.
        for name in ("page-one", "page-two"):
            created = http.post(
                "/apis/batch/v1/namespaces/default/jobs", json=job(name, "import time; time.sleep(60)")
            )
            assert created.status_code == 201, created.text
        first = http.get("/apis/batch/v1/namespaces/default/jobs", params={"limit": 1}).json()
        assert len(first["items"]) == 1 and first["metadata"].get("continue")
        rest = http.get(
            "/apis/batch/v1/namespaces/default/jobs",
            params={"limit": 100, "continue": first["metadata"]["continue"]},
        ).json()
        assert first["items"][0]["metadata"]["name"] not in [j["metadata"]["name"] for j in rest["items"]]


async def test_ttl_after_finished_deletes_the_job(api: kr8s.asyncio.Api) -> None:
    await Job(job("short-lived", ttlSecondsAfterFinished=0), api=api).create()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            await Job({"metadata": {"name": "short-lived", "namespace": "default"}}, api=api).refresh()
        except kr8s.NotFoundError:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the finished Job was not deleted")
