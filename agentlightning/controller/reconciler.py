"""The reconcile loop shared by both runners. The Gateway is the source of truth.

* Queued rollouts are read with a long-poll (a new one starts at once) and claimed
  (`queuing -> running` with a new `last_attempt_id`) up to the runner's capacity. Against a
  Gateway without long-poll (v1.0) the same read answers at once and is repeated every
  `poll_interval`.
* Each attempt is supervised until it ends or times out, then reported (`succeeded|failed`).
  Infrastructure failures become a new attempt (`running -> running`, new attempt id) while
  `max_attempts` allows.
* Every `resync_interval` the Gateway's running rollouts are compared with what runs here: an
  attempt whose rollout was deleted, finished elsewhere or superseded is stopped; a claim whose
  answer was lost is resolved.
* At start-up, rollouts left running are adopted when their attempt still lives, reported when it
  ended meanwhile, else failed (or retried as a new attempt).
* Gateway outages are waited out with backoff; nothing here raises out of the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from agentlightning.client import (
    AsyncGatewayClient,
    BadRequest,
    Conflict,
    GatewayError,
    GatewayUnavailable,
    NotFound,
    ServerError,
)
from agentlightning.controller.config import ControllerConfig
from agentlightning.controller.metrics import ControllerMetrics
from agentlightning.controller.runner import (
    Handle,
    LaunchError,
    Outcome,
    Runner,
    attempt_number,
    new_attempt_id,
)
from agentlightning.log import get_logger
from agentlightning.schemas import MAX_OUTCOME_DETAIL, AttemptOutcome, Rollout, RolloutState

log = get_logger("controller")

MAX_ERROR_MESSAGE = 4000
GATEWAY_ERRORS = (GatewayUnavailable, GatewayError)


class _Backoff:
    def __init__(self, first: float = 0.5, cap: float = 10.0) -> None:
        self.first, self.cap, self.current = first, cap, first

    def next(self) -> float:
        delay, self.current = self.current, min(self.current * 2, self.cap)
        return delay

    def reset(self) -> None:
        self.current = self.first


@dataclass
class Active:
    """What this controller runs for one rollout (one attempt at a time)."""

    rollout: Rollout
    attempt_id: str
    number: int
    patched_epoch: int = 0  # value of the claim counter when the Gateway last confirmed this attempt
    handle: Handle | None = None
    task: asyncio.Task[None] | None = None
    stop_reason: str | None = None  # set when the controller stops the attempt itself
    report: bool = True  # False once the Gateway no longer wants to hear about it
    decided: bool = False  # the outcome is known; only its report is left
    history: list[str] = field(default_factory=list)  # failures of earlier attempts

    @property
    def rollout_id(self) -> str:
        return self.rollout.rollout_id


def _truncate(message: str, limit: int = MAX_ERROR_MESSAGE) -> str:
    return message if len(message) <= limit else message[: limit - 15] + "\n…(truncated)"


class Reconciler:
    def __init__(self, config: ControllerConfig, runner: Runner, client: AsyncGatewayClient) -> None:
        self.config = config
        self.runner = runner
        self.client = client
        self.active: dict[str, Active] = {}
        # Rollouts that may be ours without an attempt here: a claim whose answer was lost
        # (attempt id we sent) or one the runner could not look up at start-up (None).
        self._unresolved: dict[str, str | None] = {}
        self._epoch = 0
        self._slot_freed = asyncio.Event()
        self._stopping = asyncio.Event()
        self._force = asyncio.Event()
        self._stop_reason = "the controller shut down"
        self._send_log_path = True
        self._long_poll: bool | None = None
        self.metrics = ControllerMetrics()
        self.metrics.track_running(lambda: sum(1 for a in self.active.values() if a.handle is not None))

    # --- life cycle ---------------------------------------------------------------------

    def stop(self, reason: str) -> None:
        """Begin a graceful shutdown (a second call hurries it)."""
        if self._stopping.is_set():
            log.warning("shutdown_forced", reason=reason)
            self._force.set()
            return
        log.info("shutdown_requested", reason=reason)
        self._stop_reason = f"the controller shut down ({reason}) while the agent was running"
        self._stopping.set()

    async def run(self) -> None:
        """Reconcile until stop(); then stop or leave running attempts (per runner) and return."""
        await self.runner.start()
        loops: list[asyncio.Task[None]] = []
        stopping = asyncio.create_task(self._stopping.wait())
        try:
            recover = asyncio.create_task(self._recover_all(), name="recover")
            await asyncio.wait({recover, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not recover.done():
                recover.cancel()
            await asyncio.gather(recover, return_exceptions=True)
            if not self._stopping.is_set():
                loops = [
                    asyncio.create_task(self._poll_loop(), name="poll"),
                    asyncio.create_task(self._resync_loop(), name="resync"),
                ]
            await stopping
        finally:
            stopping.cancel()
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            await self._shutdown()
            await self.runner.close()

    async def _shutdown(self) -> None:
        attempts = [a for a in self.active.values() if a.task is not None]
        if not attempts:
            return
        kills: list[asyncio.Task[None]] = []
        if self.runner.kill_on_shutdown:
            for active in attempts:
                if not active.decided:
                    active.stop_reason = self._stop_reason
                    if active.handle is not None:
                        kills.append(asyncio.create_task(active.handle.kill()))
        else:
            for active in attempts:
                if not active.decided and active.task is not None:
                    active.task.cancel()  # left running; a restarted controller adopts it
        tasks = {a.task for a in attempts if a.task is not None}
        log.info("shutdown_waiting", attempts=len(tasks), timeout_s=self.config.shutdown_timeout)
        every = asyncio.create_task(asyncio.wait(tasks))
        force = asyncio.create_task(self._force.wait())  # a second signal: do not wait any longer
        await asyncio.wait(
            {every, force}, timeout=self.config.shutdown_timeout, return_when=asyncio.FIRST_COMPLETED
        )
        every.cancel()
        force.cancel()
        left = [t for t in tasks if not t.done()]
        for task in left:
            task.cancel()
        await asyncio.gather(*tasks, *kills, return_exceptions=True)
        if left:
            log.warning("shutdown_incomplete", unreported=len(left))

    # --- reading queued rollouts --------------------------------------------------------

    def _free_slots(self) -> int:
        capacity = self.runner.capacity
        return 500 if capacity is None else max(0, capacity - len(self.active))

    async def _poll_loop(self) -> None:
        backoff = _Backoff()
        while True:
            while self._free_slots() == 0:
                self._slot_freed.clear()
                await self._slot_freed.wait()
            free = self._free_slots()
            try:
                if self.config.long_poll_seconds > 0:
                    polled = await self.client.long_poll_rollouts(
                        [RolloutState.QUEUING], self.config.long_poll_seconds, limit=free
                    )
                    rollouts, long_polled = polled.value, polled.long_polled
                    if long_polled != self._long_poll:
                        self._long_poll = long_polled
                        log.info(
                            "gateway_read_mode",
                            mode="long-poll"
                            if long_polled
                            else f"polling every {self.config.poll_interval}s",
                        )
                else:
                    rollouts, long_polled = (
                        await self.client.list_rollouts([RolloutState.QUEUING], free),
                        False,
                    )
            except GATEWAY_ERRORS as exc:
                delay = backoff.next()
                log.warning("gateway_read_failed", error=str(exc), retry_in_s=delay)
                await asyncio.sleep(delay)
                continue
            except Exception:
                log.exception("poll_loop_error")
                await asyncio.sleep(backoff.next())
                continue
            todo = [r for r in rollouts if r.rollout_id not in self.active][:free]
            started = sum(await asyncio.gather(*(self._claim(r) for r in todo))) if todo else 0
            if todo and started == 0:
                await asyncio.sleep(backoff.next())  # every claim failed: do not spin on them
                continue
            backoff.reset()
            if not todo and (rollouts or not long_polled):
                # Nothing new: a v1.0 Gateway answered at once, or what it lists already runs here.
                await asyncio.sleep(self.config.poll_interval)

    async def _claim(self, rollout: Rollout) -> bool:
        active = Active(rollout, new_attempt_id(1), 1)
        self.active[rollout.rollout_id] = active  # holds the slot while the claim is in flight
        if not await self._patch_running(active, active.attempt_id):
            self._release(active)
            return False
        self._unresolved.pop(rollout.rollout_id, None)
        active.task = asyncio.create_task(self._run_attempt(active), name=f"rollout-{rollout.rollout_id}")
        return True

    def _release(self, active: Active) -> None:
        if self.active.get(active.rollout_id) is active:
            del self.active[active.rollout_id]
        self._slot_freed.set()

    async def _patch_running(self, active: Active, attempt_id: str, error_message: str | None = None) -> bool:
        """Record `attempt_id` as the rollout's running attempt. False when the Gateway refused or
        its answer was lost (then the rollout is remembered for the next resync)."""
        rollout_id = active.rollout_id
        fields: dict[str, Any] = {
            "state": RolloutState.RUNNING,
            "last_attempt_id": attempt_id,
            **self.runner.claim_fields(active.rollout, attempt_id),
        }
        if error_message is not None:
            fields["error_message"] = _truncate(error_message)
        for _ in range(2):
            if not self._send_log_path:
                fields.pop("log_path", None)
            try:
                updated = await self.client.patch_rollout(rollout_id, **fields)
            except BadRequest as exc:
                if "log_path" in fields and "log_path" in exc.detail:
                    log.info("gateway_without_log_path", hint="a v1.0 Gateway: log paths are not recorded")
                    self._send_log_path = False
                    continue
                log.error("claim_rejected", rollout_id=rollout_id, error=exc.detail)
                return False
            except (Conflict, NotFound) as exc:
                log.info("claim_lost", rollout_id=rollout_id, reason=exc.detail)
                return False
            except GATEWAY_ERRORS as exc:
                log.warning("claim_unconfirmed", rollout_id=rollout_id, attempt_id=attempt_id, error=str(exc))
                self._unresolved[rollout_id] = attempt_id
                return False
            self._epoch += 1
            active.rollout, active.attempt_id, active.patched_epoch = updated, attempt_id, self._epoch
            return True
        return False

    # --- one rollout, attempt after attempt ----------------------------------------------

    async def _run_attempt(
        self, active: Active, handle: Handle | None = None, outcome: Outcome | None = None
    ) -> None:
        """Run (or keep watching) the rollout's attempts until one is reported. `handle`: an adopted
        attempt; `outcome`: one that already ended."""
        try:
            while True:
                if outcome is None:
                    outcome = await self._attempt(active, handle)
                handle = None
                if outcome is None:  # the rollout was taken away from us: nothing to report
                    self.runner.forget(active.rollout_id, active.attempt_id)
                    return
                active.decided = True
                if (
                    outcome.retryable
                    and (active.number < self.config.max_attempts or outcome.never_started)
                    and not self._stopping.is_set()
                    and active.report
                ):
                    failed_id, number = active.attempt_id, active.number
                    active.history.append(f"attempt {number} ({failed_id}): {outcome.message}")
                    next_id = new_attempt_id(number + 1)
                    note = f"attempt {number} failed ({outcome.message}); retrying as attempt {number + 1}"
                    log.warning(
                        "attempt_retry",
                        rollout_id=active.rollout_id,
                        failed_attempt=failed_id,
                        attempt_id=next_id,
                        reason=outcome.message,
                    )
                    await self._report_outcome(active, outcome)
                    if not await self._patch_running(active, next_id, error_message=note):
                        self.runner.forget(active.rollout_id, failed_id)
                        return
                    self.runner.forget(active.rollout_id, failed_id)
                    active.number, active.decided, outcome = number + 1, False, None
                    continue
                if active.report:
                    await self._report(active, outcome)
                return
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("attempt_error", rollout_id=active.rollout_id, attempt_id=active.attempt_id)
        finally:
            self._release(active)

    async def _attempt(self, active: Active, handle: Handle | None) -> Outcome | None:
        metrics = self.metrics
        if handle is None:
            launched = time.perf_counter()
            try:
                handle = await self.runner.launch(active.rollout, active.attempt_id)
            except LaunchError as exc:
                metrics.failures.labels("launch").inc()
                return Outcome.failure(exc.message, exc.retryable)
            except Exception as exc:  # a bug here must not leave the rollout running for ever
                metrics.failures.labels("launch").inc()
                log.exception("launch_error", rollout_id=active.rollout_id, attempt_id=active.attempt_id)
                return Outcome.failure(
                    f"the controller could not start the attempt: {type(exc).__name__}: {exc}"
                )
            metrics.starts.inc()
            metrics.start_latency.observe(time.perf_counter() - launched)
            log.debug(
                "attempt_started",
                rollout_id=active.rollout_id,
                attempt_id=active.attempt_id,
                attempt=active.number,
            )
        active.handle = handle
        timeout = active.rollout.config.timeout_seconds
        try:
            if active.stop_reason is None:
                outcome = await asyncio.wait_for(handle.wait(), max(0.0, handle.deadline - time.time()))
                if active.stop_reason is None:
                    if not outcome.succeeded:
                        metrics.failures.labels("agent").inc()
                    return outcome
            else:
                await handle.kill()
        except TimeoutError:
            active.stop_reason = (
                f"timed out after {timeout:g}s (config.timeout_seconds); the agent was stopped"
            )
            log.warning("attempt_timeout", rollout_id=active.rollout_id, attempt_id=active.attempt_id)
            metrics.failures.labels("timeout").inc()
            await handle.kill()
            return Outcome.failure(active.stop_reason, kind=AttemptOutcome.TIMEOUT) if active.report else None
        metrics.failures.labels("stopped").inc()
        return Outcome.failure(active.stop_reason, kind=self.runner.lost_as) if active.report else None

    def _outcome_kind(self, outcome: Outcome) -> AttemptOutcome:
        if outcome.kind is not None:
            return outcome.kind
        return self.runner.lost_as if outcome.retryable else AttemptOutcome.AGENT_ERROR

    async def _report_outcome(self, active: Active, outcome: Outcome, retry: bool = True) -> None:
        """How a failed attempt ended, as evidence for the Gateway (docs/reliability.md); a success
        the Gateway judges itself (a reward or none). A Gateway without the route (v1.0) or a
        deleted rollout: nothing to record. `retry`: through outages, else they raise."""
        if outcome.succeeded:
            return
        kind = self._outcome_kind(outcome)
        detail = _truncate(outcome.message or "failed", MAX_OUTCOME_DETAIL)
        backoff = _Backoff(0.5, 10.0)
        while True:
            try:
                await self.client.report_outcome(active.rollout_id, active.attempt_id, kind, detail)
                return
            except (GatewayUnavailable, ServerError) as exc:
                if not retry or self._force.is_set():
                    raise
                delay = backoff.next()
                log.warning(
                    "outcome_report_failed", rollout_id=active.rollout_id, error=str(exc), retry_in_s=delay
                )
                await asyncio.sleep(delay)
            except GatewayError as exc:  # deleted, or a Gateway without outcomes (v1.0): nothing kept
                if not isinstance(exc, NotFound):
                    log.warning("outcome_not_recorded", rollout_id=active.rollout_id, error=exc.detail)
                return

    async def _report(self, active: Active, outcome: Outcome) -> None:
        """Patch the final state; retried through Gateway outages (until the shutdown deadline)."""
        rollout_id, attempt_id = active.rollout_id, active.attempt_id
        fields: dict[str, Any] = {
            "state": RolloutState.SUCCEEDED if outcome.succeeded else RolloutState.FAILED
        }
        if not outcome.succeeded:
            message = outcome.message or "failed"
            if active.history:
                message += "\nearlier attempts:\n" + "\n".join(active.history)
            fields["error_message"] = _truncate(message)
        elif active.number > 1:
            fields["error_message"] = None  # clear the note of the retry
        backoff = _Backoff(0.5, 10.0)
        while True:
            try:
                # First the evidence, then the end: the trainer reads both once it sees the end.
                await self._report_outcome(active, outcome, retry=False)
                await self.client.patch_rollout(rollout_id, **fields)
                break
            except NotFound:
                log.info("report_dropped", rollout_id=rollout_id, reason="the rollout was deleted")
                break
            except Conflict as exc:
                # Maybe our own earlier try went through; otherwise somebody else decided.
                with contextlib.suppress(*GATEWAY_ERRORS):
                    current = (await self.client.get_rollout(rollout_id)).rollout.status
                    if current.state != fields["state"] or current.last_attempt_id != attempt_id:
                        log.warning(
                            "report_conflict",
                            rollout_id=rollout_id,
                            gateway_state=current.state.value,
                            error=exc.detail,
                        )
                break
            except BadRequest as exc:
                log.error("report_rejected", rollout_id=rollout_id, error=exc.detail)
                break
            except GATEWAY_ERRORS as exc:
                delay = backoff.next()
                log.warning("report_failed", rollout_id=rollout_id, error=str(exc), retry_in_s=delay)
                await asyncio.sleep(delay)
        self.runner.forget(rollout_id, attempt_id)
        self.metrics.reported.labels(fields["state"].value).inc()
        log.info(
            "rollout_finished",
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            state=fields["state"].value,
            error=(outcome.message or "")[:300] or None,
        )

    # --- comparing with the Gateway -----------------------------------------------------

    async def _resync_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.resync_interval)
            try:
                await self._resync()
            except GATEWAY_ERRORS as exc:
                log.warning("resync_failed", error=str(exc))
            except Exception:
                log.exception("resync_error")

    async def _resync(self) -> None:
        epoch = self._epoch
        running = {
            r.rollout_id: r for r in await self.client.list_rollouts([RolloutState.RUNNING], limit=10000)
        }
        stops: list[asyncio.Task[None]] = []
        for active in list(self.active.values()):
            if active.decided or active.task is None or active.patched_epoch > epoch:
                continue
            listed = running.get(active.rollout_id)
            if listed is not None and listed.status.last_attempt_id == active.attempt_id:
                continue
            reason: str | None = None
            try:
                current = (await self.client.get_rollout(active.rollout_id)).rollout
            except NotFound:
                reason = "the rollout was deleted"
            else:
                if current.status.state != RolloutState.RUNNING:
                    reason = f"the rollout was moved to {current.status.state.value} elsewhere"
                elif current.status.last_attempt_id != active.attempt_id and active.patched_epoch <= epoch:
                    reason = f"attempt {current.status.last_attempt_id} superseded it"
            if reason is not None:
                stops.append(asyncio.create_task(self._take_away(active, reason)))
        await asyncio.gather(*stops)
        for rollout_id, attempt_id in list(self._unresolved.items()):
            if rollout_id in self.active:
                self._unresolved.pop(rollout_id, None)
                continue
            rollout = running.get(rollout_id)
            if rollout is None:
                self._unresolved.pop(rollout_id, None)  # not running (any more): nothing of ours
                continue
            if attempt_id is not None and rollout.status.last_attempt_id == attempt_id:
                # Our claim went through but we never started it: start it now.
                self._unresolved.pop(rollout_id, None)
                active = Active(rollout, attempt_id, attempt_number(attempt_id), patched_epoch=self._epoch)
                self.active[rollout_id] = active
                active.task = asyncio.create_task(self._run_attempt(active), name=f"rollout-{rollout_id}")
                continue
            await self._recover_one(rollout)

    async def _take_away(self, active: Active, reason: str) -> None:
        log.warning(
            "attempt_cancelled", rollout_id=active.rollout_id, attempt_id=active.attempt_id, reason=reason
        )
        active.report = False
        active.stop_reason = reason
        if active.handle is not None:
            await active.handle.kill()

    # --- start-up recovery --------------------------------------------------------------

    async def _recover_all(self) -> None:
        backoff = _Backoff()
        while True:
            try:
                running = await self.client.list_rollouts([RolloutState.RUNNING], limit=10000)
                break
            except GATEWAY_ERRORS as exc:
                delay = backoff.next()
                log.warning("gateway_unreachable_at_start", error=str(exc), retry_in_s=delay)
                await asyncio.sleep(delay)
        if running:
            log.info("recovering", running=len(running))
        limit = asyncio.Semaphore(16)  # a runner may ask its backend about each one

        async def recover(rollout: Rollout) -> None:
            async with limit:
                await self._recover_one(rollout)

        await asyncio.gather(*(recover(r) for r in running))

    async def _recover_one(self, rollout: Rollout) -> None:
        """A running rollout with no attempt here: adopt, report or fail/retry it."""
        rollout_id, attempt_id = rollout.rollout_id, rollout.status.last_attempt_id
        result: Handle | Outcome | None = None
        if attempt_id is not None:
            try:
                result = await self.runner.recover(rollout, attempt_id)
            except Exception as exc:
                log.warning("recover_deferred", rollout_id=rollout_id, error=f"{type(exc).__name__}: {exc}")
                self._unresolved[rollout_id] = None
                return
        self._unresolved.pop(rollout_id, None)
        active = Active(rollout, attempt_id or "", attempt_number(attempt_id), patched_epoch=self._epoch)
        self.active[rollout_id] = active
        if isinstance(result, Handle):
            log.info("attempt_adopted", rollout_id=rollout_id, attempt_id=attempt_id)
            active.task = asyncio.create_task(self._run_attempt(active, handle=result))
            return
        if result is None:
            result = Outcome.failure(
                f"no live agent for attempt {attempt_id} after the controller restarted",
                retryable=True,
            )
        log.info(
            "attempt_recovered", rollout_id=rollout_id, attempt_id=attempt_id, succeeded=result.succeeded
        )
        active.task = asyncio.create_task(self._run_attempt(active, outcome=result))
