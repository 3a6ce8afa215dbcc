"""Kubernetes runner: one Job per attempt, through kr8s.

Jobs are followed by a watch (changes arrive at once) and by a full read of Jobs and pods every
`poll_interval` (catches what a broken watch missed, finds pods that cannot start). A Job's end
becomes the attempt's Outcome: Complete -> succeeded; Failed -> failed with the reason (deadline,
the container's exit code, message and last log lines), retryable when its pod was evicted or
disrupted; deleted by someone else -> failed. A pod stuck pulling its image or unable to create
its container fails the rollout after `stuck_pod_seconds` instead of waiting for the deadline.
"""

from __future__ import annotations

import asyncio
import calendar
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, cast

import httpx
import kr8s
import kr8s.asyncio
from kr8s.asyncio.objects import Job, Pod

from agentlightning.controller.config import ControllerConfig
from agentlightning.controller.env import agl_env, conventional_env
from agentlightning.controller.k8s_job import (
    ATTEMPT_LABEL,
    MANAGED_BY,
    MANAGED_BY_KEY,
    ROLLOUT_LABEL,
    JobSpecError,
    job_name,
    label_value,
    render_job,
    shape_job,
)
from agentlightning.controller.runner import Handle, LaunchError, Outcome, Runner, StartupError
from agentlightning.log import get_logger
from agentlightning.schemas import AttemptOutcome, Rollout

log = get_logger("controller.k8s")

STUCK_REASONS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError"}
)
DISRUPTION_REASONS = frozenset(
    {"Evicted", "Preempting", "NodeLost", "Shutdown", "Terminated", "NodeShutdown"}
)
# A container ended by the node, not by its own code: the attempt's pod was lost.
LOST_CONTAINER_REASONS = frozenset({"OOMKilled", "ContainerStatusUnknown", "Evicted"})
API_ERRORS: tuple[type[Exception], ...] = (
    kr8s.ServerError,
    kr8s.APITimeoutError,
    httpx.TransportError,
    OSError,
)
# What reading or writing one object may raise: the API's errors, or a reply kr8s cannot parse.
READ_ERRORS: tuple[type[Exception], ...] = (*API_ERRORS, ValueError)


class SlidingWindow:
    """At most `limit` acquisitions in any `window` seconds (0 = no limit)."""

    def __init__(
        self,
        limit: int,
        window: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.limit, self.window, self.clock, self.sleep = limit, window, clock, sleep
        self._stamps: deque[float] = deque()
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        if self.limit <= 0:
            return
        async with self._lock:
            while True:
                now = self.clock()
                while self._stamps and self._stamps[0] <= now - self.window:
                    self._stamps.popleft()
                if len(self._stamps) < self.limit:
                    self._stamps.append(now)
                    return
                await self.sleep(self._stamps[0] + self.window - now)


def _status_code(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    return response.status_code if response is not None else None


def _api_message(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    if isinstance(status, dict) and status.get("message"):
        return str(status["message"])
    return str(exc) or type(exc).__name__


def _raw(obj: Any) -> dict[str, Any]:
    raw = obj.raw if hasattr(obj, "raw") else obj
    return raw.to_dict() if hasattr(raw, "to_dict") else dict(raw)


def _timestamp(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return float(calendar.timegm(time.strptime(value, "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return None


class K8sHandle(Handle):
    """One Job. Its outcome is set by the runner's watch and reads."""

    def __init__(
        self, runner: K8sRunner, name: str, rollout_id: str, attempt_id: str, deadline: float
    ) -> None:
        self.runner = runner
        self.name = name
        self.rollout_id = rollout_id
        self.attempt_id = attempt_id
        self.pod_key = (label_value(rollout_id), label_value(attempt_id))  # our labels on its pods
        self.deadline = deadline
        self.outcome: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self.created = False
        self.deleting = False
        self.concluding = False  # a Failed Job's details are being read
        self.stuck_since: float | None = None
        self.seen_at = time.monotonic()

    def conclude(self, outcome: Outcome) -> None:
        if not self.outcome.done():
            self.outcome.set_result(outcome)

    async def wait(self) -> Outcome:
        return await asyncio.shield(self.outcome)

    async def kill(self) -> None:
        self.deleting = True
        await self.runner.delete_job(self.name)
        self.conclude(Outcome.failure(f"the controller deleted Job {self.name}"))


class K8sRunner(Runner):
    lost_as = AttemptOutcome.POD_LOST

    def __init__(self, config: ControllerConfig) -> None:
        self.config = config
        self.k8s = config.k8s_runner
        self.capacity = self.k8s.max_active_jobs or None
        self.kill_on_shutdown = self.k8s.delete_jobs_on_shutdown
        self.agent_url = config.agl_server.agent_url or config.agl_server.url
        self.key = config.agl_server.key
        self.limiter = SlidingWindow(self.k8s.max_jobs_per_minute)
        self.handles: dict[str, K8sHandle] = {}
        self._api: kr8s.asyncio.Api | None = None
        self._api_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []

    # --- connection -------------------------------------------------------------------

    async def api(self) -> kr8s.asyncio.Api:
        """The API client, connected on first use (a cluster that is down is retried later)."""
        async with self._api_lock:
            if self._api is None:
                self._api = await kr8s.asyncio.api(
                    kubeconfig=self.k8s.kubeconfig or None,
                    context=self.k8s.context or None,
                    namespace=self.k8s.namespace,
                )
            return self._api

    async def start(self) -> None:
        try:
            api = await self.api()
            version = await api.version()
            log.info("k8s_connected", server=api.auth.server, version=version.get("gitVersion"))
        except API_ERRORS as exc:
            log.warning("k8s_unreachable_at_start", error=_api_message(exc), hint="retried in the background")
        except ValueError as exc:  # no usable kubeconfig or in-cluster account
            raise StartupError(f"cannot configure the Kubernetes client: {exc}") from exc
        self._tasks = [
            asyncio.create_task(self._watch_loop(), name="k8s-watch"),
            asyncio.create_task(self._read_loop(), name="k8s-read"),
        ]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        session = getattr(self._api, "_session", None)  # kr8s offers no public close
        if session is not None:
            with contextlib.suppress(Exception):
                await session.aclose()

    # --- starting ---------------------------------------------------------------------

    def claim_fields(self, rollout: Rollout, attempt_id: str) -> dict[str, Any]:
        return {"k8s_job_name": job_name(rollout.rollout_id, attempt_id)}

    def _agent_env(self, key: str, rollout: Rollout, attempt_id: str) -> dict[str, str]:
        agl = agl_env(self.agent_url, key, rollout.rollout_id, attempt_id, rollout.is_train)
        return {**conventional_env(agl), **agl} if self.config.conventional_env else agl

    def _job_spec(self, rollout: Rollout, attempt_id: str, name: str, key: str) -> dict[str, Any]:
        if rollout.config.k8s is None:
            raise JobSpecError("the rollout has no config.k8s.job_template; the k8s runner needs one")
        context = {
            "input": rollout.input,
            "job_name": name,
            "rollout_id": rollout.rollout_id,
            "attempt_id": attempt_id,
            "is_train": rollout.is_train,
            "metadata": rollout.metadata.model_dump(mode="json"),
        }
        rendered = render_job(rollout.config.k8s.job_template, context)
        return shape_job(
            rendered,
            name=name,
            namespace=self.k8s.namespace,
            rollout_id=rollout.rollout_id,
            attempt_id=attempt_id,
            timeout_seconds=rollout.config.timeout_seconds,
            ttl_after_finished=self.k8s.ttl_after_finished,
            env=self._agent_env(key, rollout, attempt_id),
        )

    async def launch(self, rollout: Rollout, attempt_id: str) -> Handle:
        name = job_name(rollout.rollout_id, attempt_id)
        try:
            spec = self._job_spec(
                rollout, attempt_id, name, await self.agent_key(rollout.rollout_id, attempt_id)
            )
        except JobSpecError as exc:
            raise LaunchError(str(exc)) from None
        timeout = rollout.config.timeout_seconds
        give_up = time.time() + timeout
        handle = K8sHandle(
            self, name, rollout.rollout_id, attempt_id, give_up + self.k8s.deadline_slack_seconds
        )
        self.handles[name] = handle
        delay = 1.0
        while True:
            await self.limiter.acquire()
            try:
                await Job(spec, api=await self.api()).create()
                break
            except kr8s.ServerError as exc:
                status = _status_code(exc)
                if status == 409:  # ours already: a retried create whose answer was lost
                    log.info("job_exists", job=name)
                    break
                if status in (400, 422):  # the spec itself is wrong: retrying cannot help
                    del self.handles[name]
                    raise LaunchError(f"Kubernetes rejected Job {name}: {_api_message(exc)}") from None
                error = f"{status}: {_api_message(exc)}"
            except READ_ERRORS as exc:
                error = _api_message(exc)
            if time.time() + delay > give_up:
                del self.handles[name]
                raise LaunchError(
                    f"could not create Job {name} within the rollout's timeout ({timeout:g}s): {error}"
                )
            log.warning("job_create_failed", job=name, error=error, retry_in_s=delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)
        handle.created = True
        handle.seen_at = time.monotonic()
        log.info("job_created", job=name, rollout_id=rollout.rollout_id, attempt_id=attempt_id)
        return handle

    async def delete_job(self, name: str) -> None:
        """Delete a Job and its pods; gone already is fine. API errors are retried a few times."""
        for attempt in range(5):
            try:
                job = Job({"metadata": {"name": name, "namespace": self.k8s.namespace}}, api=await self.api())
                await job.delete(propagation_policy="Background")
                return
            except kr8s.NotFoundError:
                return
            except READ_ERRORS as exc:
                log.warning("job_delete_failed", job=name, error=_api_message(exc))
                await asyncio.sleep(min(2**attempt, 10))

    # --- following Jobs ---------------------------------------------------------------

    async def _watch_loop(self) -> None:
        delay = 1.0
        while True:
            try:
                api = await self.api()
                async for event, job in api.watch(
                    "jobs", namespace=self.k8s.namespace, label_selector={MANAGED_BY_KEY: MANAGED_BY}
                ):
                    delay = 1.0
                    handle = self.handles.get(job.name)
                    if handle is None:
                        continue
                    if event == "DELETED":
                        self._gone(handle)
                    else:
                        self._observe(handle, _raw(job))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("k8s_watch_failed", error=_api_message(exc), retry_in_s=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)

    async def _read_loop(self) -> None:
        while True:
            await asyncio.sleep(self.k8s.poll_interval)
            try:
                await self.read_all()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("k8s_read_failed", error=_api_message(exc))

    async def read_all(self) -> None:
        """One full read of our Jobs and pods."""
        if not any(h.created and not h.outcome.done() for h in self.handles.values()):
            return
        api = await self.api()
        selector = {MANAGED_BY_KEY: MANAGED_BY}
        listed_at = time.monotonic()
        jobs = {
            cast(Job, j).name: _raw(j)
            async for j in api.get("jobs", namespace=self.k8s.namespace, label_selector=selector)
        }
        for name, handle in list(self.handles.items()):
            if not handle.created or handle.outcome.done():
                continue
            if name in jobs:
                handle.seen_at = listed_at
                self._observe(handle, jobs[name])
            elif handle.seen_at < listed_at - 1.0:  # created just now may not be listed yet
                job = await self._get_job(name)  # not listed: unlabelled (a v1.0 Job) or gone?
                if job is None:
                    self._gone(handle)
                else:
                    handle.seen_at = listed_at
                    self._observe(handle, job)
        pods = [_raw(p) async for p in api.get("pods", namespace=self.k8s.namespace, label_selector=selector)]
        self._check_pods(pods)

    async def _get_job(self, name: str) -> dict[str, Any] | None:
        job = Job({"metadata": {"name": name, "namespace": self.k8s.namespace}}, api=await self.api())
        try:
            await job.refresh()
        except kr8s.NotFoundError:
            return None
        return _raw(job)

    def _observe(self, handle: K8sHandle, job: dict[str, Any]) -> None:
        if handle.outcome.done() or handle.concluding:
            return
        conditions = {
            c.get("type"): c
            for c in (job.get("status") or {}).get("conditions") or []
            if isinstance(c, dict) and c.get("status") == "True"
        }
        if "Complete" in conditions:
            handle.conclude(Outcome.success())
        elif "Failed" in conditions:
            handle.concluding = True
            task = asyncio.create_task(self._conclude_failed(handle, job, conditions["Failed"]))
            self._tasks.append(task)
            task.add_done_callback(lambda t: self._tasks.remove(t) if t in self._tasks else None)

    def _gone(self, handle: K8sHandle) -> None:
        if handle.deleting or handle.outcome.done() or handle.concluding:
            return
        handle.conclude(
            Outcome.failure(
                f"Job {handle.name} was deleted while the rollout was running", kind=AttemptOutcome.POD_LOST
            )
        )

    async def _conclude_failed(self, handle: K8sHandle, job: dict[str, Any], failed: dict[str, Any]) -> None:
        reason, message = failed.get("reason") or "Failed", failed.get("message") or ""
        if reason == "DeadlineExceeded":
            deadline = (job.get("spec") or {}).get("activeDeadlineSeconds")
            handle.conclude(
                Outcome.failure(
                    f"timed out: Job {handle.name} ran past activeDeadlineSeconds={deadline} ({message})",
                    kind=AttemptOutcome.TIMEOUT,
                )
            )
            return
        try:
            outcome = await self._pod_failure(handle, reason, message)
        except Exception as exc:
            outcome = Outcome.failure(
                f"Job {handle.name} failed ({reason}: {message}); its pods could not be read: {exc}"
            )
        handle.conclude(outcome)

    async def _pod_failure(self, handle: K8sHandle, reason: str, message: str) -> Outcome:
        api = await self.api()
        selector = {ROLLOUT_LABEL: handle.pod_key[0], ATTEMPT_LABEL: handle.pod_key[1]}
        pods = [
            cast(Pod, p) async for p in api.get("pods", namespace=self.k8s.namespace, label_selector=selector)
        ]
        for pod in pods:
            raw = _raw(pod)
            status = raw.get("status") or {}
            disrupted = [
                c
                for c in status.get("conditions") or []
                if c.get("type") == "DisruptionTarget" and c.get("status") == "True"
            ]
            if status.get("reason") in DISRUPTION_REASONS or disrupted:
                why = status.get("reason") or disrupted[0].get("reason")
                detail = status.get("message") or (disrupted[0].get("message") if disrupted else "") or ""
                return Outcome.failure(
                    f"the pod of Job {handle.name} was {why}: {detail}".rstrip(": "),
                    retryable=True,
                    kind=AttemptOutcome.POD_LOST,
                )
        parts = [f"Job {handle.name} failed ({reason}: {message})".replace(": )", ")")]
        kind = AttemptOutcome.AGENT_ERROR
        for pod in pods:
            raw = _raw(pod)
            for container in (raw.get("status") or {}).get("containerStatuses") or []:
                terminated = (container.get("state") or {}).get("terminated")
                if terminated and terminated.get("exitCode", 0) != 0:
                    text = f"container {container.get('name')} exited with code {terminated.get('exitCode')}"
                    if terminated.get("reason"):
                        text += f" ({terminated['reason']})"
                    if terminated.get("reason") in LOST_CONTAINER_REASONS:
                        kind = AttemptOutcome.POD_LOST  # the memory limit's kill, not the agent's exit
                    if terminated.get("message"):
                        text += f": {terminated['message']}"
                    parts.append(text)
            tail = await self._log_tail(pod)
            if tail:
                parts.append(f"last output of pod {pod.name}:\n{tail}")
        return Outcome.failure("; ".join(parts), kind=kind)

    async def _log_tail(self, pod: Pod) -> str:
        if self.k8s.error_tail_lines <= 0:
            return ""
        with contextlib.suppress(*API_ERRORS, ValueError):
            lines = [line async for line in pod.logs(tail_lines=self.k8s.error_tail_lines, timeout=10)]
            return "\n".join(lines[-self.k8s.error_tail_lines :])
        return ""

    def _check_pods(self, pods: list[dict[str, Any]]) -> None:
        now = time.monotonic()
        stuck: dict[tuple[str, str], str] = {}
        for pod in pods:
            labels = (pod.get("metadata") or {}).get("labels") or {}
            key = (labels.get(ROLLOUT_LABEL, ""), labels.get(ATTEMPT_LABEL, ""))
            status = pod.get("status") or {}
            for container in (status.get("initContainerStatuses") or []) + (
                status.get("containerStatuses") or []
            ):
                waiting = (container.get("state") or {}).get("waiting") or {}
                if waiting.get("reason") in STUCK_REASONS:
                    stuck[key] = (
                        f"pod {pod['metadata'].get('name')} cannot start: container {container.get('name')}: "
                        f"{waiting['reason']}: {waiting.get('message', '')}"
                    ).rstrip(": ")
        for name, handle in list(self.handles.items()):
            if handle.outcome.done() or not handle.created:
                continue
            if handle.pod_key not in stuck:
                handle.stuck_since = None
                continue
            handle.stuck_since = handle.stuck_since or now
            if now - handle.stuck_since >= self.k8s.stuck_pod_seconds:
                log.warning("pod_stuck", job=name, reason=stuck[handle.pod_key])
                handle.deleting = True
                handle.conclude(Outcome.failure(stuck[handle.pod_key]))
                task = asyncio.create_task(self.delete_job(name))
                self._tasks.append(task)
                task.add_done_callback(lambda t: self._tasks.remove(t) if t in self._tasks else None)

    # --- restart ----------------------------------------------------------------------

    async def recover(self, rollout: Rollout, attempt_id: str) -> Handle | Outcome | None:
        name = rollout.status.k8s_job_name or job_name(rollout.rollout_id, attempt_id)
        job = Job({"metadata": {"name": name, "namespace": self.k8s.namespace}}, api=await self.api())
        try:
            await job.refresh()
        except kr8s.NotFoundError:
            return None
        raw = _raw(job)
        annotations = (raw.get("metadata") or {}).get("annotations") or {}
        if (
            annotations.get(ATTEMPT_LABEL, attempt_id) != attempt_id
            or annotations.get(ROLLOUT_LABEL, rollout.rollout_id) != rollout.rollout_id
        ):
            return None  # a Job of that name, but not this attempt's
        created = _timestamp((raw.get("metadata") or {}).get("creationTimestamp")) or time.time()
        deadline = created + rollout.config.timeout_seconds + self.k8s.deadline_slack_seconds
        handle = K8sHandle(self, name, rollout.rollout_id, attempt_id, deadline)
        handle.created = True
        self.handles[name] = handle
        self._observe(handle, raw)
        return handle

    def forget(self, rollout_id: str, attempt_id: str) -> None:
        for name, handle in list(self.handles.items()):
            if handle.rollout_id == rollout_id and handle.attempt_id == attempt_id:
                del self.handles[name]
