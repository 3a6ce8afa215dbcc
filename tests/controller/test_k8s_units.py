"""Job templates and the Job-creation rate limit, without a cluster."""

from __future__ import annotations

import asyncio
import re

import pytest
import yaml

from agentlightning.controller.k8s import SlidingWindow
from agentlightning.controller.k8s_job import (
    JobSpecError,
    job_name,
    label_value,
    render_job,
    shape_job,
    yaml_escape,
)

TEMPLATE = """
apiVersion: batch/v1
kind: Job
metadata:
  name: {{ job_name }}
  namespace: somewhere-else
  labels: {team: rl}
spec:
  backoffLimit: 6
  template:
    spec:
      restartPolicy: OnFailure
      initContainers:
      - name: setup
        image: busybox
      containers:
      - name: agent
        image: agent:1
        args: [{{ input.question | yaml_escape }}, {{ input.n | yaml_escape }}, {{ input | yaml_escape }}]
        env:
        - {name: AGL_KEY, value: stale}
        - {name: MODE, value: {{ "train" if is_train else "val" }}}
      - name: sidecar
        image: proxy:1
"""


def context(**input: object) -> dict:
    return {
        "input": input,
        "job_name": "agl-x-1-abc",
        "rollout_id": "r",
        "attempt_id": "a",
        "is_train": True,
        "metadata": {},
    }


@pytest.mark.parametrize(
    "value", ["plain", 'quote " and \\ backslash', "new\nline: {not: yaml}", "- dash", "", "ünïcode", "#x"]
)
def test_yaml_escape_round_trips_any_string(value: str) -> None:
    assert yaml.safe_load(f"k: {yaml_escape(value)}") == {"k": value}


def test_yaml_escape_turns_other_values_into_their_json_text() -> None:
    assert yaml.safe_load(f"k: {yaml_escape(7)}") == {"k": "7"}
    assert yaml.safe_load(f"k: {yaml_escape({'a': [1, None]})}") == {"k": '{"a":[1,null]}'}


def test_render_and_shape_set_everything_the_controller_owns() -> None:
    rendered = render_job(TEMPLATE, context(question='say "hi"\nplease', n=3))
    assert rendered["spec"]["template"]["spec"]["containers"][0]["args"][:2] == ['say "hi"\nplease', "3"]
    env = {"AGL_OPENAI_BASE_URL": "http://gw/p", "AGL_EVENT_URL": "http://gw/e", "AGL_KEY": "k"}
    job = shape_job(
        rendered,
        name="agl-x-1-abc",
        namespace="agents",
        rollout_id="r",
        attempt_id="attempt-1-xyz",
        timeout_seconds=90.5,
        ttl_after_finished=300,
        env=env,
    )
    assert job["metadata"]["name"] == "agl-x-1-abc" and job["metadata"]["namespace"] == "agents"
    assert job["metadata"]["labels"] == {
        "team": "rl",
        "app.kubernetes.io/managed-by": "agentlightning",
        "agentlightning.io/rollout-id": "r",
        "agentlightning.io/attempt-id": "attempt-1-xyz",
    }
    spec = job["spec"]
    assert (spec["backoffLimit"], spec["activeDeadlineSeconds"], spec["ttlSecondsAfterFinished"]) == (
        0,
        91,
        300,
    )
    pod = spec["template"]
    assert pod["metadata"]["labels"]["agentlightning.io/attempt-id"] == "attempt-1-xyz"
    assert pod["spec"]["restartPolicy"] == "Never"
    for container in pod["spec"]["initContainers"] + pod["spec"]["containers"]:
        values = {e["name"]: e["value"] for e in container["env"]}
        assert {k: values[k] for k in env} == env  # every container, the stale AGL_KEY replaced
    assert {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}["MODE"] == "train"
    assert rendered["spec"]["backoffLimit"] == 6  # shaping works on a copy


def test_ttl_minus_one_keeps_finished_jobs() -> None:
    rendered = render_job(TEMPLATE, context(question="q", n=1))
    rendered["spec"]["ttlSecondsAfterFinished"] = 5
    job = shape_job(
        rendered,
        name="n",
        namespace="d",
        rollout_id="r",
        attempt_id="a",
        timeout_seconds=1,
        ttl_after_finished=-1,
        env={},
    )
    assert "ttlSecondsAfterFinished" not in job["spec"]


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{{ input.missing | yaml_escape }}", "has no attribute 'missing'"),
        ("{{ nothing }}", "'nothing' is undefined (the template can use input, job_name"),
        ("{% if %}", "job_template line 1"),
        ("{{ ''.__class__.__mro__ }}", "job_template"),  # the sandbox refuses
        ("a: [", "did not render valid YAML"),
        ("", "rendered 0 documents"),
        ("- a\n- b", "must render a Job object; it rendered a list"),
        ("kind: Job\napiVersion: batch/v2", "apiVersion='batch/v2'"),
        ("kind: Job\napiVersion: batch/v1\nspec: {template: {spec: {containers: []}}}", "non-empty list"),
    ],
)
def test_template_errors_say_what_is_wrong(template: str, message: str) -> None:
    with pytest.raises(JobSpecError, match=re.escape(message)):
        render_job(template, context(question="q"))


def test_job_names_are_valid_unique_per_attempt_and_stable() -> None:
    long_id = "Rollout_ID/with:ÜNICODE " * 10
    for rollout_id in ("abc", long_id, "---", "r.1"):
        name = job_name(rollout_id, "attempt-12-ff")
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 63
        assert name == job_name(rollout_id, "attempt-12-ff")
        assert name != job_name(rollout_id, "attempt-12-fe")
        assert "-12-" in name


def test_label_values_are_kept_when_valid_else_hashed() -> None:
    assert label_value("attempt-1-abc") == "attempt-1-abc"
    for bad in ("x" * 64, "has space", "-leading", "a/b"):
        hashed = label_value(bad)
        assert hashed.startswith("h-") and len(hashed) <= 63 and hashed == label_value(bad)


async def test_sliding_window_allows_n_per_window() -> None:
    now = [0.0]
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    window = SlidingWindow(3, 60.0, clock=lambda: now[0], sleep=sleep)
    for at in (0.0, 10.0, 20.0):
        now[0] = at
        await window.acquire()
    assert slept == []
    now[0] = 30.0
    await window.acquire()  # the 4th waits until the 1st leaves the window
    assert slept == [30.0] and now[0] == 60.0
    await window.acquire()
    assert now[0] == 70.0
    unlimited = SlidingWindow(0, clock=lambda: 0.0, sleep=sleep)
    await asyncio.gather(*(unlimited.acquire() for _ in range(100)))
    assert len(slept) == 2
