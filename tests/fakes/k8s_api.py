"""A Kubernetes API server test double, served over HTTP on loopback.

It speaks enough of the real API for a client library (kr8s) to work unchanged: version and
discovery (`/version`, `/api`, `/api/v1`, `/apis`, `/apis/batch/v1`), batch/v1 Jobs (create,
get, list by label and field selector, watch, delete with propagation policies) and v1 Pods
(get, list, watch, logs). Errors are `Status` objects with the real reasons and codes: 404
NotFound, 409 AlreadyExists, 422 Invalid (with the real message format), 401 without the token.

It also does what the Job controller and the kubelet would do, with local processes in place
of containers:
* A created Job gets a pod; the pod's first container "runs": its `command` + `args` (with
  `$(VAR)` expansion) are started locally in their own process group, with the container's
  `env` and `workingDir`; output goes to the pod log. The exit code becomes the container's
  terminated state, the pod phase, and the Job status: `active`, `succeeded`/`failed`,
  `startTime`, `completionTime`, conditions `SuccessCriteriaMet`+`Complete` or
  `FailureTarget`+`Failed` (reason `BackoffLimitExceeded`), with `backoffLimit` retries.
* `resources.limits.memory` is the kernel's cgroup limit: a container process whose resident
  memory passes it is killed with SIGKILL and terminated with reason `OOMKilled`, exit code 137
  (its memory is read from /proc every 20 ms: a spike shorter than that can slip through).
* `activeDeadlineSeconds` stops the pod (SIGTERM, then SIGKILL after the grace period) and
  fails the Job with reason `DeadlineExceeded`. `ttlSecondsAfterFinished` deletes it later.
* An image whose registry host ends in `.invalid` cannot be pulled: the container waits in
  `ErrImagePull` / `ImagePullBackOff`. An env value from a Secret or ConfigMap (none exist here)
  leaves it in `CreateContainerConfigError`. A container without `command` cannot run here.
* Deleting a Job with `propagationPolicy` Background or Foreground deletes its pods (stopping
  their processes); without one, as for batch/v1 Jobs in a real cluster, the pods are orphaned.

Test controls (not Kubernetes API) under `/_fake/`: `POST /_fake/faults` (answer the next N
requests matching a method and path pattern with a status), `POST /_fake/evict` (evict a Job's
pod: SIGKILL, phase Failed, reason Evicted, DisruptionTarget condition), `GET /_fake/requests`.

    python -m tests.fakes.k8s_api --port 6443 --token secret --workdir /tmp/fake-k8s

What a real cluster can still do differently (not reproduced here):
* Scheduling and images: pods may stay Pending (no capacity, selectors, taints) or take minutes
  to pull; here they start at once. Unschedulable pods are not failed early by the controller:
  they run into the Job's activeDeadlineSeconds, which counts pending time too.
* Admission: quotas, LimitRanges, PodSecurity or webhooks can let the Job be created but refuse
  its pods (FailedCreate events, no pod, no condition) - the controller then waits for the
  deadline. RBAC denials (403) are retried until the rollout's timeout.
* Validation: only a subset of the real checks is made (names, labels, containers, image,
  restartPolicy, a few numeric fields, env value types); unknown fields are kept here, silently
  dropped by a real server.
* Containers: only the first container runs, only with an explicit `command`; no image
  entrypoints, init containers, sidecars, volumes, resource limits other than memory, Secrets or
  ConfigMaps (any reference to one is "not found"), no service-link environment.
* Timing: the real Job controller updates status seconds later, tracks pods with finalizers and
  deletes pods after their grace period (30 s by default; here --grace). Foreground deletion
  keeps the Job until its pods are gone; here the Job goes at once.
* Disruptions: a real eviction or node loss may delete the pod before the controller reads it,
  so the controller may see a plain failure and not retry it.
* Watches: real servers end watches after a few minutes, may answer 410 Gone for an old
  resourceVersion at any time, and throttle clients (429); the transport is TLS with client
  certificates, exec plugins or expiring tokens rather than plain HTTP with a fixed token.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import re
import signal
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

VERSION = {
    "major": "1",
    "minor": "31",
    "gitVersion": "v1.31.0",
    "gitCommit": "fake",
    "gitTreeState": "clean",
    "buildDate": "2024-08-13T00:00:00Z",
    "goVersion": "go1.22.5",
    "compiler": "gc",
    "platform": "linux/amd64",
}
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
_QUANTITY = re.compile(r"^(\d+)(Ki|Mi|Gi|K|M|G)?$")
_UNITS = {None: 1, "K": 10**3, "M": 10**6, "G": 10**9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
OOM_CHECK_S = 0.02


def memory_bytes(quantity: Any) -> int | None:
    """A memory quantity (`64Mi`, `100M`, `1048576`) in bytes; None when absent or not understood."""
    match = _QUANTITY.match(str(quantity)) if quantity is not None else None
    return int(match.group(1)) * _UNITS[match.group(2)] if match else None


def resident_bytes(pid: int) -> int:
    """The process's resident memory, from /proc (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


async def oom_killer(pid: int, limit: int) -> bool:
    """The cgroup's OOM killer: SIGKILL the container's processes once its memory passes `limit`."""
    while True:
        if resident_bytes(pid) > limit:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            return True
        await asyncio.sleep(OOM_CHECK_S)


def _now_iso(at: float | None = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at if at is not None else time.time()))


def _resource(
    name: str, kind: str, namespaced: bool, singular: str, verbs: list[str], short: list[str]
) -> dict:
    entry = {"name": name, "singularName": singular, "namespaced": namespaced, "kind": kind, "verbs": verbs}
    if short:
        entry["shortNames"] = short
    return entry


CORE_RESOURCES = [
    _resource("namespaces", "Namespace", False, "namespace", ["get", "list"], ["ns"]),
    _resource("pods", "Pod", True, "pod", ["get", "list", "watch", "delete"], ["po"]),
    _resource("pods/log", "Pod", True, "", ["get"], []),
]
BATCH_RESOURCES = [
    _resource("jobs", "Job", True, "job", ["create", "delete", "get", "list", "watch"], []),
    _resource("jobs/status", "Job", True, "", ["get"], []),
]


def status_error(code: int, reason: str, message: str, details: dict | None = None) -> JSONResponse:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return JSONResponse(body, status_code=code)


# --- selectors ---------------------------------------------------------------------------


def _split_selector(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def matches_labels(labels: dict[str, str], selector: str | None) -> bool:
    """Equality (=, ==, !=), set (in, notin) and existence (key, !key) requirements."""
    for term in _split_selector(selector or ""):
        if m := re.fullmatch(r"(\S+)\s+(in|notin)\s+\((.*)\)", term):
            key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            if (op == "in") != (labels.get(key) in values):
                return False
        elif "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def matches_fields(obj: dict, selector: str | None) -> bool:
    meta = obj.get("metadata", {})
    values = {"metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace")}
    for term in _split_selector(selector or ""):
        negate = "!=" in term
        key, value = term.replace("!=", "=").replace("==", "=").split("=", 1)
        if (values.get(key.strip()) == value.strip()) == negate:
            return False
    return True


# --- validation --------------------------------------------------------------------------


def validate_job(job: Any) -> list[str]:
    """Field errors in the API server's words (a subset of its checks)."""
    if not isinstance(job, dict):
        return ["<body>: Invalid value: the body must be a Job object"]
    errors: list[str] = []
    meta = job.get("metadata") or {}
    name = meta.get("name")
    if not name:
        errors.append("metadata.name: Required value: name or generateName is required")
    elif len(name) > 63:
        errors.append(f'metadata.name: Invalid value: "{name}": must be no more than 63 characters')
    elif not _DNS_SUBDOMAIN.match(name):
        errors.append(
            f'metadata.name: Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist of lower case '
            "alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
        )
    for where, labels in (
        ("metadata.labels", meta.get("labels")),
        (
            "spec.template.metadata.labels",
            ((job.get("spec") or {}).get("template") or {}).get("metadata", {}).get("labels"),
        ),
    ):
        for value in (labels or {}).values():
            if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
                errors.append(
                    f'{where}: Invalid value: "{value}": a valid label must be 63 characters or less'
                )
    spec = job.get("spec") or {}
    for field, minimum in (("backoffLimit", 0), ("activeDeadlineSeconds", 1), ("ttlSecondsAfterFinished", 0)):
        value = spec.get(field)
        if value is not None and (not isinstance(value, int) or value < minimum):
            errors.append(f"spec.{field}: Invalid value: {value}: must be greater than or equal to {minimum}")
    pod_spec = (spec.get("template") or {}).get("spec") or {}
    restart = pod_spec.get("restartPolicy")
    if restart not in ("OnFailure", "Never"):
        if restart is None:
            errors.append(
                'spec.template.spec.restartPolicy: Required value: valid values: "OnFailure", "Never"'
            )
        else:
            errors.append(
                f'spec.template.spec.restartPolicy: Unsupported value: "{restart}": supported values: "OnFailure", "Never"'
            )
    containers = pod_spec.get("containers")
    if not containers:
        errors.append("spec.template.spec.containers: Required value")
    for i, container in enumerate(containers or []):
        where = f"spec.template.spec.containers[{i}]"
        cname = container.get("name")
        if not cname:
            errors.append(f"{where}.name: Required value")
        elif not _DNS_LABEL.match(cname):
            errors.append(
                f'{where}.name: Invalid value: "{cname}": a lowercase RFC 1123 label must consist of ...'
            )
        if not container.get("image"):
            errors.append(f"{where}.image: Required value")
        for j, env in enumerate(container.get("env") or []):
            if not env.get("name"):
                errors.append(f"{where}.env[{j}].name: Required value")
    return errors


def bad_types(job: Any) -> str | None:
    """What a real API server rejects with 400 while decoding (wrong JSON types)."""
    if not isinstance(job, dict):
        return None
    pod_spec = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
    for container in pod_spec.get("containers") or []:
        for env in container.get("env") or []:
            if "value" in env and not isinstance(env["value"], str):
                kind = type(env["value"]).__name__
                return (
                    f"json: cannot unmarshal {kind} into Go struct field EnvVar.spec.template.spec.containers.env.value "
                    "of type string"
                )
    return None


# --- the cluster -------------------------------------------------------------------------


@dataclass
class Fault:
    method: str
    path: re.Pattern[str]
    status: int
    times: int
    message: str


class FakeCluster:
    def __init__(
        self, workdir: Path, token: str | None = None, grace: float = 1.0, namespaces: tuple[str, ...] = ()
    ) -> None:
        self.workdir = workdir
        self.token = token
        self.grace = grace
        self.namespaces = {"default", "kube-system", "kube-public", *namespaces}
        self.jobs: dict[tuple[str, str], dict] = {}
        self.pods: dict[tuple[str, str], dict] = {}
        self.procs: dict[tuple[str, str], asyncio.subprocess.Process] = {}
        self.history: list[tuple[int, str, str, dict]] = []  # (resourceVersion, kind, type, object)
        self.faults: list[Fault] = []
        self.requests: list[str] = []
        self._rv = itertools.count(1000)
        self._changed = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._stop_pod: dict[tuple[str, str], asyncio.Event] = {}
        self._evicted: set[tuple[str, str]] = set()

    # bookkeeping
    def _emit(self, kind: str, event: str, obj: dict) -> None:
        rv = next(self._rv)
        obj["metadata"]["resourceVersion"] = str(rv)
        self.history.append((rv, kind, event, orjson.loads(orjson.dumps(obj))))
        if len(self.history) > 20000:
            del self.history[:10000]
        self._changed.set()
        self._changed = asyncio.Event()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @property
    def resource_version(self) -> str:
        return str(self.history[-1][0]) if self.history else "999"

    # jobs
    def create_job(self, namespace: str, job: dict) -> dict:
        meta = job.setdefault("metadata", {})
        meta.update(
            namespace=namespace,
            uid=str(uuid.uuid4()),
            creationTimestamp=_now_iso(),
            generation=1,
        )
        uid = meta["uid"]
        spec = job.setdefault("spec", {})
        spec.setdefault("backoffLimit", 6)
        spec.setdefault("completions", 1)
        spec.setdefault("parallelism", 1)
        spec.setdefault("completionMode", "NonIndexed")
        spec.setdefault("suspend", False)
        controller_labels = {
            "batch.kubernetes.io/controller-uid": uid,
            "batch.kubernetes.io/job-name": meta["name"],
            "controller-uid": uid,
            "job-name": meta["name"],
        }
        spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
        template = spec.setdefault("template", {})
        template.setdefault("metadata", {}).setdefault("labels", {}).update(controller_labels)
        job["kind"], job["apiVersion"] = "Job", "batch/v1"
        job["status"] = {}
        self.jobs[(namespace, meta["name"])] = job
        self._emit("jobs", "ADDED", job)
        self._spawn(self._run_job((namespace, meta["name"])))
        return job

    def delete_job(self, key: tuple[str, str], propagation: str | None) -> dict | None:
        job = self.jobs.pop(key, None)
        if job is None:
            return None
        job["metadata"]["deletionTimestamp"] = _now_iso()
        self._emit("jobs", "DELETED", job)
        for pod_key, pod in list(self.pods.items()):
            owners = pod["metadata"].get("ownerReferences") or []
            if not any(o.get("uid") == job["metadata"]["uid"] for o in owners):
                continue
            if propagation in ("Background", "Foreground"):
                self._spawn(self.delete_pod(pod_key))
            else:  # orphaned: the pod keeps running without an owner
                pod["metadata"]["ownerReferences"] = []
                self._emit("pods", "MODIFIED", pod)
        return job

    async def delete_pod(self, key: tuple[str, str]) -> None:
        stop = self._stop_pod.get(key)
        if stop is not None:
            stop.set()
        await self._kill(key)
        pod = self.pods.pop(key, None)
        if pod is not None:
            pod["metadata"]["deletionTimestamp"] = _now_iso()
            self._emit("pods", "DELETED", pod)

    def _set_job_status(self, key: tuple[str, str], **changes: Any) -> None:
        job = self.jobs.get(key)
        if job is None:
            return
        job["status"].update(changes)
        self._emit("jobs", "MODIFIED", job)

    def _finish_job(self, key: tuple[str, str], succeeded: bool, reason: str = "", message: str = "") -> None:
        job = self.jobs.get(key)
        if job is None:
            return
        now = _now_iso()
        status = job["status"]
        status.update(active=0, ready=0, terminating=0)
        condition = {"status": "True", "lastProbeTime": now, "lastTransitionTime": now}
        if succeeded:
            status["succeeded"] = status.get("succeeded", 0) + 1
            status["completionTime"] = now
            status["conditions"] = [
                {
                    "type": "SuccessCriteriaMet",
                    "reason": "CompletionsReached",
                    "message": "Reached expected number of succeeded pods",
                    **condition,
                },
                {
                    "type": "Complete",
                    "reason": "CompletionsReached",
                    "message": "Reached expected number of succeeded pods",
                    **condition,
                },
            ]
        else:
            status["conditions"] = [
                {"type": "FailureTarget", "reason": reason, "message": message, **condition},
                {"type": "Failed", "reason": reason, "message": message, **condition},
            ]
        self._emit("jobs", "MODIFIED", job)
        ttl = job["spec"].get("ttlSecondsAfterFinished")
        if ttl is not None:
            self._spawn(self._ttl_delete(key, job["metadata"]["uid"], ttl))

    async def _ttl_delete(self, key: tuple[str, str], uid: str, ttl: float) -> None:
        await asyncio.sleep(ttl)
        job = self.jobs.get(key)
        if job is not None and job["metadata"]["uid"] == uid:
            self.delete_job(key, "Background")

    async def _run_job(self, key: tuple[str, str]) -> None:
        job = self.jobs[key]
        spec = job["spec"]
        started = time.time()
        deadline = spec.get("activeDeadlineSeconds")
        deadline_at = time.monotonic() + deadline if deadline else None
        self._set_job_status(
            key, startTime=_now_iso(started), active=1, ready=0, terminating=0, uncountedTerminatedPods={}
        )
        failures = 0
        for attempt in itertools.count():
            if key not in self.jobs:
                return
            result = await self._run_pod(key, job, attempt, deadline_at)
            if key not in self.jobs or result == "deleted":
                return
            if result == "succeeded":
                self._finish_job(key, True)
                return
            if result == "deadline":
                self._finish_job(
                    key, False, "DeadlineExceeded", "Job was active longer than specified deadline"
                )
                return
            failures += 1
            self._set_job_status(key, failed=failures)
            if failures > spec.get("backoffLimit", 6):
                self._finish_job(
                    key, False, "BackoffLimitExceeded", "Job has reached the specified backoff limit"
                )
                return
            await asyncio.sleep(0.2)  # the Job controller's back-off before the next pod

    # pods
    def _new_pod(self, key: tuple[str, str], job: dict, attempt: int) -> tuple[tuple[str, str], dict]:
        namespace, job_name = key
        template = job["spec"]["template"]
        name = f"{job_name}-{uuid.uuid4().hex[:5]}"
        spec = orjson.loads(orjson.dumps(template.get("spec") or {}))
        containers = spec.get("containers") or []
        pod = {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": str(uuid.uuid4()),
                "creationTimestamp": _now_iso(),
                "generateName": f"{job_name}-",
                "labels": dict(template.get("metadata", {}).get("labels") or {}),
                "annotations": {
                    **(template.get("metadata", {}).get("annotations") or {}),
                    "batch.kubernetes.io/job-tracking": "",
                },
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": job_name,
                        "uid": job["metadata"]["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {**spec, "nodeName": "fake-node"},
            "status": {
                "phase": "Pending",
                "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": _now_iso()}],
                "containerStatuses": [
                    {
                        "name": c.get("name"),
                        "image": c.get("image"),
                        "ready": False,
                        "restartCount": 0,
                        "started": False,
                        "state": {"waiting": {"reason": "ContainerCreating"}},
                    }
                    for c in containers
                ],
                "startTime": _now_iso(),
            },
        }
        pod_key = (namespace, name)
        self.pods[pod_key] = pod
        self._emit("pods", "ADDED", pod)
        return pod_key, pod

    def _set_container(
        self, pod_key: tuple[str, str], state: dict, phase: str | None = None, **extra: Any
    ) -> None:
        pod = self.pods.get(pod_key)
        if pod is None:
            return
        first = pod["status"]["containerStatuses"][0]
        first["state"] = state
        first["ready"] = "running" in state
        first["started"] = "running" in state
        if "terminated" in state:
            first["lastState"] = {}
        if phase:
            pod["status"]["phase"] = phase
        pod["status"].update(extra)
        self._emit("pods", "MODIFIED", pod)

    async def _wait_stop(
        self, pod_key: tuple[str, str], deadline_at: float | None, seconds: float | None = None
    ) -> str | None:
        """Sleep until the pod is stopped ("stopped"), the Job's deadline passes ("deadline") or
        `seconds` elapse (None). Deadlines are on the monotonic clock."""
        stop = self._stop_pod[pod_key]
        ends = [t for t in (deadline_at, time.monotonic() + seconds if seconds is not None else None) if t]
        until = min(ends) if ends else None
        while True:
            remaining = None if until is None else until - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), remaining)
                return "stopped"
        return "deadline" if deadline_at is not None and time.monotonic() >= deadline_at else None

    async def _run_pod(self, key: tuple[str, str], job: dict, attempt: int, deadline_at: float | None) -> str:
        pod_key, pod = self._new_pod(key, job, attempt)
        self._stop_pod[pod_key] = asyncio.Event()
        try:
            return await self._run_container(pod_key, pod, deadline_at)
        finally:
            self._stop_pod.pop(pod_key, None)

    async def _run_container(self, pod_key: tuple[str, str], pod: dict, deadline_at: float | None) -> str:
        container = pod["spec"]["containers"][0]
        image = container.get("image", "")
        host = image.split("/")[0] if "/" in image else ""
        blocked: tuple[str, str] | None = None
        if host.endswith(".invalid"):
            blocked = (
                "ErrImagePull",
                f'failed to pull and unpack image "{image}": failed to resolve reference "{image}": '
                f"dial tcp: lookup {host}: no such host",
            )
        for env in container.get("env") or []:
            ref = env.get("valueFrom") or {}
            for kind, field in (("secret", "secretKeyRef"), ("configmap", "configMapKeyRef")):
                if field in ref:
                    blocked = ("CreateContainerConfigError", f'{kind} "{ref[field].get("name")}" not found')
        if blocked is not None:
            reason, message = blocked
            while True:
                self._set_container(pod_key, {"waiting": {"reason": reason, "message": message}})
                result = await self._wait_stop(pod_key, deadline_at, 1.0)
                if result == "stopped":
                    return "deleted"
                if result == "deadline":
                    await self.delete_pod(pod_key)
                    return "deadline"
                if reason in ("ErrImagePull", "ImagePullBackOff"):  # alternates like the kubelet's back-off
                    reason, message = (
                        ("ImagePullBackOff", f'Back-off pulling image "{image}"')
                        if reason == "ErrImagePull"
                        else blocked
                    )
        env = {e["name"]: str(e.get("value", "")) for e in container.get("env") or [] if "name" in e}
        env = {k: _VAR_REF.sub(lambda m: env.get(m.group(1), m.group(0)), v) for k, v in env.items()}
        argv = [*(container.get("command") or []), *(container.get("args") or [])]
        argv = [_VAR_REF.sub(lambda m: env.get(m.group(1), m.group(0)), a) for a in argv]
        now = _now_iso()
        if not container.get("command"):
            self._set_container(
                pod_key,
                {
                    "terminated": {
                        "exitCode": 128,
                        "reason": "StartError",
                        "message": "the fake cluster runs only containers with a command",
                        "startedAt": now,
                        "finishedAt": now,
                    }
                },
                phase="Failed",
            )
            return "failed"
        log_path = self.workdir / f"{pod_key[0]}_{pod_key[1]}.log"
        process_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOSTNAME": pod_key[1], **env}
        try:
            log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    env=process_env,
                    cwd=container.get("workingDir") or None,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log,
                    stderr=asyncio.subprocess.STDOUT,
                    start_new_session=True,
                )
            finally:
                os.close(log)
        except OSError as exc:
            self._set_container(
                pod_key,
                {
                    "terminated": {
                        "exitCode": 128,
                        "reason": "StartError",
                        "message": str(exc),
                        "startedAt": now,
                        "finishedAt": now,
                    }
                },
                phase="Failed",
            )
            return "failed"
        self.procs[pod_key] = proc
        started = _now_iso()
        self.pods[pod_key]["status"]["conditions"].append(
            {"type": "Ready", "status": "True", "lastTransitionTime": started}
        )
        self._set_container(pod_key, {"running": {"startedAt": started}}, phase="Running")
        job_key = (pod_key[0], pod["metadata"]["ownerReferences"][0]["name"])
        self._set_job_status(job_key, ready=1)
        exited = asyncio.create_task(proc.wait())
        stopped = asyncio.create_task(self._wait_stop(pod_key, deadline_at))
        limit = memory_bytes(((container.get("resources") or {}).get("limits") or {}).get("memory"))
        oom = asyncio.create_task(oom_killer(proc.pid, limit)) if limit else None
        await asyncio.wait({exited, stopped}, return_when=asyncio.FIRST_COMPLETED)
        oom_killed = oom is not None and oom.done()
        if oom is not None:
            oom.cancel()
        if not exited.done():
            result = stopped.result()
            await self._kill(pod_key)
            if pod_key in self._evicted:
                return "failed"
            if result == "deadline":
                await self.delete_pod(pod_key)
                return "deadline"
            return "deleted"
        stopped.cancel()
        code = exited.result()
        self.procs.pop(pod_key, None)
        if pod_key in self._evicted:
            return "failed"
        finished = _now_iso()
        terminated = {
            "exitCode": code if code >= 0 else 128 - code,
            "reason": "OOMKilled" if oom_killed else "Completed" if code == 0 else "Error",
            "startedAt": started,
            "finishedAt": finished,
        }
        self._set_container(pod_key, {"terminated": terminated}, phase="Succeeded" if code == 0 else "Failed")
        return "succeeded" if code == 0 else "failed"

    async def _kill(self, pod_key: tuple[str, str]) -> None:
        proc = self.procs.pop(pod_key, None)
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), self.grace)
        except TimeoutError:
            pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()

    async def evict(self, namespace: str, job_name: str) -> bool:
        for pod_key, pod in list(self.pods.items()):
            owners = pod["metadata"].get("ownerReferences") or []
            if pod_key[0] != namespace or not any(o.get("name") == job_name for o in owners):
                continue
            if pod["status"]["phase"] not in ("Pending", "Running"):
                continue
            self._evicted.add(pod_key)
            proc = self.procs.pop(pod_key, None)
            if proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
            now = _now_iso()
            pod["status"].update(
                phase="Failed",
                reason="Evicted",
                message="The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi.",
            )
            pod["status"]["conditions"].append(
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "TerminationByKubelet",
                    "message": "The node was low on resource: memory.",
                    "lastTransitionTime": now,
                }
            )
            self._set_container(
                pod_key,
                {"terminated": {"exitCode": 137, "reason": "Error", "startedAt": now, "finishedAt": now}},
            )
            stop = self._stop_pod.get(pod_key)
            if stop is not None:
                stop.set()
            return True
        return False

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for key in list(self.procs):
            await self._kill(key)

    # watches
    async def watch(
        self,
        kind: str,
        namespace: str | None,
        labels: str | None,
        fields: str | None,
        since: str | None,
        timeout_seconds: float | None,
    ) -> AsyncIterator[bytes]:
        def wanted(obj: dict) -> bool:
            meta = obj["metadata"]
            return (
                (namespace is None or meta.get("namespace") == namespace)
                and matches_labels(meta.get("labels") or {}, labels)
                and matches_fields(obj, fields)
            )

        ends = time.monotonic() + timeout_seconds if timeout_seconds else None
        if since and since != "0":
            last = int(since)
            if self.history and last < self.history[0][0] - 1:
                gone = {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Failure",
                    "message": "too old resource version",
                    "reason": "Expired",
                    "code": 410,
                }
                yield orjson.dumps({"type": "ERROR", "object": gone}) + b"\n"
                return
        else:  # "start at most recent": every current object as ADDED first
            last = int(self.resource_version)
            store = self.jobs if kind == "jobs" else self.pods
            for obj in list(store.values()):
                if wanted(obj):
                    yield orjson.dumps({"type": "ADDED", "object": obj}) + b"\n"
        while True:
            changed = self._changed
            for rv, k, event, obj in [h for h in self.history if h[0] > last]:
                last = rv
                if k == kind and wanted(obj):
                    yield orjson.dumps({"type": event, "object": obj}) + b"\n"
            remaining = None if ends is None else ends - time.monotonic()
            if remaining is not None and remaining <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), remaining)


# --- HTTP --------------------------------------------------------------------------------


def _strip_for_list(obj: dict) -> dict:
    return {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}


def build_app(cluster: FakeCluster) -> Any:
    async def version(request: Request) -> Response:
        return JSONResponse(VERSION)

    async def api_versions(request: Request) -> Response:
        return JSONResponse({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []})

    async def core_resources(request: Request) -> Response:
        return JSONResponse({"kind": "APIResourceList", "groupVersion": "v1", "resources": CORE_RESOURCES})

    async def api_groups(request: Request) -> Response:
        batch = {"groupVersion": "batch/v1", "version": "v1"}
        return JSONResponse(
            {
                "kind": "APIGroupList",
                "apiVersion": "v1",
                "groups": [{"name": "batch", "versions": [batch], "preferredVersion": batch}],
            }
        )

    async def batch_resources(request: Request) -> Response:
        return JSONResponse(
            {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": "batch/v1",
                "resources": BATCH_RESOURCES,
            }
        )

    def collection(kind: str, namespace: str | None, request: Request) -> Response:
        params = request.query_params
        if params.get("watch") in ("true", "1"):
            timeout = float(params["timeoutSeconds"]) if "timeoutSeconds" in params else None
            stream = cluster.watch(
                kind,
                namespace,
                params.get("labelSelector"),
                params.get("fieldSelector"),
                params.get("resourceVersion"),
                timeout,
            )
            return StreamingResponse(stream, media_type="application/json")
        store = cluster.jobs if kind == "jobs" else cluster.pods
        items = sorted(
            (
                o
                for (ns, _), o in store.items()
                if (namespace is None or ns == namespace)
                and matches_labels(o["metadata"].get("labels") or {}, params.get("labelSelector"))
                and matches_fields(o, params.get("fieldSelector"))
            ),
            key=lambda o: (o["metadata"]["namespace"], o["metadata"]["name"]),
        )
        offset = int(params.get("continue") or 0)
        limit = int(params.get("limit") or 0) or len(items) or 1
        page = items[offset : offset + limit]
        meta: dict[str, Any] = {"resourceVersion": cluster.resource_version}
        if offset + limit < len(items):
            meta["continue"] = str(offset + limit)
        list_kind, api_version = ("JobList", "batch/v1") if kind == "jobs" else ("PodList", "v1")
        return JSONResponse(
            {
                "kind": list_kind,
                "apiVersion": api_version,
                "metadata": meta,
                "items": [_strip_for_list(o) for o in page],
            }
        )

    async def jobs(request: Request) -> Response:
        namespace = request.path_params.get("namespace")
        if request.method == "GET":
            return collection("jobs", namespace, request)
        assert namespace is not None
        if namespace not in cluster.namespaces:
            return status_error(
                404,
                "NotFound",
                f'namespaces "{namespace}" not found',
                {"name": namespace, "kind": "namespaces"},
            )
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError as exc:
            return status_error(400, "BadRequest", f"the body of the request was in an unknown format: {exc}")
        if (problem := bad_types(body)) is not None:
            return status_error(400, "BadRequest", problem)
        name = (body.get("metadata") or {}).get("name", "") if isinstance(body, dict) else ""
        errors = validate_job(body)
        if errors:
            shown = errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
            causes = [
                {"reason": "FieldValueInvalid", "message": e.split(": ", 1)[1], "field": e.split(": ", 1)[0]}
                for e in errors
            ]
            return status_error(
                422,
                "Invalid",
                f'Job.batch "{name}" is invalid: {shown}',
                {"name": name, "group": "batch", "kind": "Job", "causes": causes},
            )
        if (namespace, name) in cluster.jobs:
            return status_error(
                409,
                "AlreadyExists",
                f'jobs.batch "{name}" already exists',
                {"name": name, "group": "batch", "kind": "jobs"},
            )
        return JSONResponse(cluster.create_job(namespace, body), status_code=201)

    async def job(request: Request) -> Response:
        namespace, name = request.path_params["namespace"], request.path_params["name"]
        key = (namespace, name)
        if request.method == "GET":
            found = cluster.jobs.get(key)
            if found is None:
                return status_error(
                    404,
                    "NotFound",
                    f'jobs.batch "{name}" not found',
                    {"name": name, "group": "batch", "kind": "jobs"},
                )
            return JSONResponse(found)
        raw = await request.body()
        options = orjson.loads(raw) if raw else {}
        propagation = request.query_params.get("propagationPolicy") or options.get("propagationPolicy")
        deleted = cluster.delete_job(key, propagation)
        if deleted is None:
            return status_error(
                404,
                "NotFound",
                f'jobs.batch "{name}" not found',
                {"name": name, "group": "batch", "kind": "jobs"},
            )
        return JSONResponse(deleted)

    async def pods(request: Request) -> Response:
        return collection("pods", request.path_params.get("namespace"), request)

    async def pod(request: Request) -> Response:
        namespace, name = request.path_params["namespace"], request.path_params["name"]
        found = cluster.pods.get((namespace, name))
        if found is None:
            return status_error(404, "NotFound", f'pods "{name}" not found', {"name": name, "kind": "pods"})
        if request.method == "DELETE":
            await cluster.delete_pod((namespace, name))
        return JSONResponse(found)

    async def pod_log(request: Request) -> Response:
        namespace, name = request.path_params["namespace"], request.path_params["name"]
        found = cluster.pods.get((namespace, name))
        if found is None:
            return status_error(404, "NotFound", f'pods "{name}" not found', {"name": name, "kind": "pods"})
        state = found["status"]["containerStatuses"][0]["state"]
        if "waiting" in state:
            container = found["spec"]["containers"][0].get("name")
            return status_error(
                400,
                "BadRequest",
                f'container "{container}" in pod "{name}" is waiting to start: {state["waiting"].get("reason")}',
            )
        path = cluster.workdir / f"{namespace}_{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        tail = request.query_params.get("tailLines")
        if tail is not None:
            text = "".join(text.splitlines(keepends=True)[-int(tail) :]) if int(tail) > 0 else ""
        return PlainTextResponse(text)

    async def namespaces(request: Request) -> Response:
        items = [{"metadata": {"name": n}, "status": {"phase": "Active"}} for n in sorted(cluster.namespaces)]
        return JSONResponse(
            {
                "kind": "NamespaceList",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": cluster.resource_version},
                "items": items,
            }
        )

    async def add_fault(request: Request) -> Response:
        body = orjson.loads(await request.body())
        cluster.faults.append(
            Fault(
                body.get("method", "*").upper(),
                re.compile(body["path"]),
                int(body.get("status", 500)),
                int(body.get("times", 1)),
                body.get("message", "injected fault"),
            )
        )
        return JSONResponse({"faults": len(cluster.faults)})

    async def evict(request: Request) -> Response:
        body = orjson.loads(await request.body())
        ok = await cluster.evict(body.get("namespace", "default"), body["job"])
        return JSONResponse({"evicted": ok}, status_code=200 if ok else 404)

    async def requests_made(request: Request) -> Response:
        return JSONResponse(cluster.requests)

    routes = [
        Route("/version", version),
        Route("/api", api_versions),
        Route("/api/v1", core_resources),
        Route("/apis", api_groups),
        Route("/apis/batch/v1", batch_resources),
        Route("/api/v1/namespaces", namespaces),
        Route("/apis/batch/v1/jobs", jobs),
        Route("/apis/batch/v1/namespaces/{namespace}/jobs", jobs, methods=["GET", "POST"]),
        Route("/apis/batch/v1/namespaces/{namespace}/jobs/{name}", job, methods=["GET", "DELETE"]),
        Route("/api/v1/pods", pods),
        Route("/api/v1/namespaces/{namespace}/pods", pods),
        Route("/api/v1/namespaces/{namespace}/pods/{name}", pod, methods=["GET", "DELETE"]),
        Route("/api/v1/namespaces/{namespace}/pods/{name}/log", pod_log),
        Route("/_fake/faults", add_fault, methods=["POST"]),
        Route("/_fake/evict", evict, methods=["POST"]),
        Route("/_fake/requests", requests_made),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await cluster.close()  # stop every pod's processes

    return _Gate(Starlette(routes=routes, lifespan=lifespan), cluster)


class _Gate:
    """Records requests, checks the token and answers injected faults before the API sees them."""

    def __init__(self, app: Starlette, cluster: FakeCluster) -> None:
        self.app, self.cluster = app, cluster

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"].startswith("/_fake/"):
            await self.app(scope, receive, send)
            return
        path, method = scope["path"], scope["method"]
        query = scope["query_string"].decode()
        self.cluster.requests.append(f"{method} {path}" + (f"?{query}" if query else ""))
        headers = dict(scope["headers"])
        response: Response | None = None
        public = path in ("/version", "/healthz", "/livez", "/readyz")  # anonymous, as in a real cluster
        if (
            self.cluster.token
            and not public
            and headers.get(b"authorization") != f"Bearer {self.cluster.token}".encode()
        ):
            response = status_error(401, "Unauthorized", "Unauthorized")
        for fault in self.cluster.faults:
            if (
                response is None
                and fault.times > 0
                and fault.method in ("*", method)
                and fault.path.search(path)
            ):
                fault.times -= 1
                reasons = {
                    500: "InternalError",
                    503: "ServiceUnavailable",
                    429: "TooManyRequests",
                    403: "Forbidden",
                }
                response = status_error(
                    fault.status, reasons.get(fault.status, "InternalError"), fault.message
                )
        if response is not None:
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Kubernetes API test double")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=6443)
    parser.add_argument("--token", default="", help="require this bearer token (empty: no auth)")
    parser.add_argument("--workdir", default=".fake-k8s", help="pod logs go here")
    parser.add_argument(
        "--grace", type=float, default=1.0, help="seconds between SIGTERM and SIGKILL of a pod"
    )
    parser.add_argument("--namespaces", default="", help="comma-separated namespaces besides default")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    extra = tuple(n for n in args.namespaces.split(",") if n)
    cluster = FakeCluster(workdir, args.token or None, args.grace, extra)
    uvicorn.run(
        build_app(cluster), host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=2
    )


if __name__ == "__main__":
    main()
