"""The rollout manager: makes rollouts on the Gateway, waits for them, collects what they recorded.

* `submit` registers the current inference endpoints with their model version again (an
  upsert), then creates `n` rollouts per prompt with pre-assigned ids (creation is
  idempotent, so the client may retry it), the prompt's group id as `data_id`, and the
  rollout config.
* Waiting reads the Gateway's terminal cursor with long-polls — one request per change, not
  one per pending rollout per second.
* A rollout that never ends cannot hang a step: every so often one list of the Gateway's
  unfinished rollouts is checked; a rollout running longer than its timeout plus a grace
  period, or any unfinished rollout when none of ours has finished for that long (a lost
  controller), is failed by the trainer and reported as lost.
* Rollouts nobody takes are said early: when not one rollout of a submission has left the queue
  `unclaimed_warning_seconds` after it (no Controller running, or one working for another
  Gateway), a warning says so, long before the stall check fails them.
* Finished rollouts' triplet events are fetched in batch requests (several at a time; one
  request per rollout from a v1.0 Gateway), in the `triplet_delta` format where the Gateway
  has it: a call's prompt comes as a reference to an earlier call's plus the new ids, so a
  long-horizon rollout's shared prefixes are not sent again (docs/long_horizon.md). Unless
  `keep_rollouts` is set, all but the newest `keep_last_rollouts` (left for the dashboard) are
  deleted from the Gateway in the background once the trainer waits for rollouts again.
"""

from __future__ import annotations

import contextlib
import itertools
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from agentlightning.client import (
    BadRequest,
    Conflict,
    GatewayClient,
    GatewayError,
    GatewayUnavailable,
    NotFound,
)
from agentlightning.log import get_logger
from agentlightning.schemas import (
    MAX_BATCH_IDS,
    AttemptOutcome,
    K8sRolloutConfig,
    LocalRolloutConfig,
    RolloutConfig,
    RolloutCreate,
    RolloutState,
    TerminalItem,
)
from agentlightning.trainer.collected import CollectedRollout
from agentlightning.trainer.config import CoreConfig
from agentlightning.trainer.gcpause import gc_paused
from agentlightning.trainer.hook_runner import HookRunner
from agentlightning.trainer.publish import EndpointPublisher, LeaseKeeper, update_together
from agentlightning.wire import expand_prompt_refs

OUTCOME_NAMES = frozenset(o.value for o in AttemptOutcome)  # a newer Gateway's other names: derived

log = get_logger("trainer")

CREATE_CHUNK = 512
LIST_LIMIT = 10000
FETCH_BATCH = 32  # rollouts per batch events request: ~3 MB of triplets for long agent runs
DELETED_BEFORE_READ = "the rollout was deleted from the Gateway before its events were read"


@dataclass(slots=True)
class _Pending:
    rollout_id: str
    group_id: str
    step: int
    sample_idx: int
    index_in_group: int
    is_train: bool
    input: Any
    lost: bool = False


@dataclass(frozen=True, slots=True)
class Group:
    """The `n` rollouts made from one prompt."""

    group_id: str
    rollout_ids: tuple[str, ...]
    step: int
    sample_idx: int
    is_train: bool


class RolloutManager:
    """Creates, tracks and collects rollouts on one Gateway. Not thread-safe: one trainer loop."""

    def __init__(
        self, config: CoreConfig, client: GatewayClient | None = None, run_id: str | None = None
    ) -> None:
        agl = config.agl
        self.config = config
        self._owns_client = client is None
        self.client = client or GatewayClient(
            agl.agl_base_url, agl.agl_key, max_connections=max(16, 2 * agl.fetch_concurrency)
        )
        self.run_id = run_id or uuid.uuid4().hex[:12]
        # One publisher per policy the run serves (docs/policies.md); `publisher` is the first.
        self.publishers = {
            name: EndpointPublisher(
                self.client,
                name,
                agl.async_rollout.drain_timeout_seconds,
                agl.async_rollout.pause_retry_after_seconds,
                agl.endpoint_lease_seconds or None,
            )
            for name in agl.policy_names
        }
        self.publisher = next(iter(self.publishers.values()))
        lease = agl.endpoint_lease_seconds
        self._lease = LeaseKeeper(self.publishers.values(), lease) if lease else None
        self._rollout_config = RolloutConfig(
            timeout_seconds=agl.rollout_timeout_seconds,
            local=(
                LocalRolloutConfig(
                    agent_class=agl.local.agent_class,
                    command=agl.local.argv(),
                    env_map=dict(agl.local.env_map),
                )
                if agl.local.agent_class or agl.local.command is not None
                else None
            ),
            k8s=K8sRolloutConfig(job_template=template) if (template := config.job_template()) else None,
        )
        self._pool = ThreadPoolExecutor(agl.fetch_concurrency, thread_name_prefix="agl-fetch")
        self._pending: dict[str, _Pending] = {}
        self._done: dict[str, CollectedRollout] = {}
        self._finish_seq: dict[str, int] = {}  # rollout id -> order in which it was collected
        self._finish_counter = itertools.count()
        self._group_counter = itertools.count()
        self._cursor: int | None = None
        self._batch_routes: bool | None = None  # None: not known yet
        self._delta_format = True  # False: the Gateway's batch route has no triplet_delta
        self._deletions: list[Future[int]] = []
        self._to_delete: list[str] = []
        self._kept: deque[str] = deque()  # the newest collected rollouts, left for the dashboard
        self._stall_seconds = agl.rollout_timeout_seconds + agl.rollout_grace_seconds
        self._lost_check_interval = min(60.0, max(1.0, self._stall_seconds / 4))
        self._last_progress = time.monotonic()
        self._last_lost_check = time.monotonic()
        self._left_wait_at: float | None = None
        self._claim_check_at: float | None = None  # when to check that the submitted rollouts were taken
        self._n_collected = 0
        self._n_collected_at_submit = 0
        self.n_lost_total = 0
        self.n_deleted = 0
        # v1.0's rollout hooks: around creation (submit) and completion (poll, before the fetch).
        self.hooks = HookRunner.from_path(agl.hooks, self.client) if agl.hooks else None

    # --- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """At the trainer's stop: the endpoints' leases end (they serve no more), deletes finish."""
        if self._lease is not None:
            self._lease.stop()
        for publisher in self.publishers.values():
            try:
                publisher.unregister()
            except (GatewayError, GatewayUnavailable) as exc:  # gone: the lease ends them there anyway
                log.warning("endpoints_not_unregistered", error=str(exc))
        self.flush_deletions()
        self._pool.shutdown(wait=True)
        if self._owns_client:
            self.client.close()

    def __enter__(self) -> RolloutManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- endpoints ------------------------------------------------------------------------

    @property
    def policy_version(self) -> int:
        return self.publisher.version

    def register_endpoints(self, endpoints: Sequence[str], version: int = 0, replace: bool = True) -> None:
        """Register the inference endpoints serving `version`. At start-up `replace` (the default)
        clears endpoints a previous run left in the Gateway's table."""
        self.publisher.register(endpoints, version, replace=replace)

    def update_weights(self, publish: Callable[[], Sequence[str] | None], version: int) -> dict[str, float]:
        """Pause, drain, `publish()`, register `version`, resume: see `publish.EndpointPublisher`."""
        return self.publisher.update(publish, version)

    def register_policies(self, endpoints: Mapping[str, Sequence[str]], versions: Mapping[str, int]) -> None:
        """At start-up: clear the Gateway's table, register every policy's endpoints and version."""
        for i, (name, urls) in enumerate(endpoints.items()):
            self.publishers[name].register(urls, versions[name], replace=i == 0)

    def update_policies(
        self, publish: Mapping[str, Callable[[], Sequence[str] | None]], versions: Mapping[str, int]
    ) -> dict[str, float]:
        """One pause for every policy: `publish[name]()`, register `versions[name]` (see
        `publish.update_together`)."""
        return update_together([(self.publishers[n], publish[n], versions[n]) for n in self.publishers])

    # --- submitting -----------------------------------------------------------------------

    @property
    def n_pending(self) -> int:
        return len(self._pending)

    def submit(
        self, samples: Sequence[Any], step: int, is_train: bool = True, n: int | None = None
    ) -> list[Group]:
        """Create `n` rollouts for each sample (its `input`); returns the groups in sample order."""
        n = n if n is not None else (self.config.rollout_n if is_train else self.config.val_rollout_n)
        if n < 1:
            raise ValueError(f"rollouts per prompt must be >= 1, got {n}")
        if self._cursor is None:
            self._cursor = self._cursor_end()  # before creating: nothing of ours can be missed
        for publisher in self.publishers.values():
            publisher.refresh()
        specs: list[RolloutCreate] = []
        groups: list[Group] = []
        pending: list[_Pending] = []
        kind = "t" if is_train else "v"
        for i, sample in enumerate(samples):
            group_id = f"{self.run_id}-{kind}{next(self._group_counter)}"
            ids = tuple(f"{group_id}-{j}" for j in range(n))
            groups.append(Group(group_id, ids, step, i, is_train))
            for j, rollout_id in enumerate(ids):
                metadata = {
                    "batch_idx": step,
                    "sample_idx_in_batch": i,
                    "data_id": group_id,
                    "index_in_group": j,
                    "run_id": self.run_id,
                }
                spec = RolloutCreate(
                    rollout_id=rollout_id,
                    input=sample,
                    is_train=is_train,
                    config=self._rollout_config,
                    metadata=metadata,  # type: ignore[arg-type]  # validated into RolloutMetadata
                )
                specs.append(self.hooks.on_enqueue(spec) if self.hooks else spec)
                pending.append(_Pending(rollout_id, group_id, step, i, j, is_train, sample))
        for start in range(0, len(specs), CREATE_CHUNK):
            try:
                self.client.create_rollouts(specs[start : start + CREATE_CHUNK])
            except TypeError as exc:
                raise ValueError(
                    f"a sample cannot be a rollout input: it must be JSON-serializable ({exc})"
                ) from exc
            for p in pending[start : start + CREATE_CHUNK]:  # tracked as soon as they exist
                self._pending[p.rollout_id] = p
        self._last_progress = time.monotonic()
        if self._claim_check_at is None and self.config.agl.unclaimed_warning_seconds > 0:
            self._claim_check_at = time.monotonic() + self.config.agl.unclaimed_warning_seconds
            self._n_collected_at_submit = self._n_collected
        log.info(
            "rollouts_submitted", step=step, prompts=len(samples), rollouts=len(specs), is_train=is_train
        )
        return groups

    # --- waiting --------------------------------------------------------------------------

    def _cursor_end(self) -> int:
        """The current end of the terminal cursor."""
        after = 0
        while True:
            page = self.client.terminal(after=after, limit=LIST_LIMIT)
            after = page.next_after
            if len(page.items) < LIST_LIMIT:
                return after

    def is_done(self, rollout_id: str) -> bool:
        return rollout_id in self._done

    def finish_seq(self, rollout_id: str) -> int:
        """Order in which a collected rollout finished (smaller: earlier)."""
        return self._finish_seq[rollout_id]

    def wait(self, until: Callable[[], bool], timeout: float | None = None) -> bool:
        """Collect finished rollouts until `until()` holds (True), or nothing is pending or
        `timeout` passed (False)."""
        entered = time.monotonic()
        # The stall clock only runs while someone waits: time spent training between steps
        # (perhaps with the Gateway paused) is not time in which rollouts failed to finish.
        if self._left_wait_at is not None:
            self._last_progress += entered - self._left_wait_at
            self._last_lost_check += entered - self._left_wait_at
        deadline = None if timeout is None else entered + timeout
        poll_wait = self.config.agl.poll_wait_seconds
        self._start_deletions()
        try:
            if self._pending:
                self.poll(0.0)  # first, whatever finished meanwhile
            while not until():
                if not self._pending:
                    return False
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    return False
                if now - self._last_lost_check >= self._lost_check_interval:
                    self._check_lost()
                    continue
                if self._claim_check_at is not None and now >= self._claim_check_at:
                    self._check_claimed()
                    continue
                wait = min(poll_wait, self._last_lost_check + self._lost_check_interval - now)
                if self._claim_check_at is not None:
                    wait = min(wait, self._claim_check_at - now)
                if deadline is not None:
                    wait = min(wait, deadline - now)
                self.poll(max(wait, 0.0))
            return True
        finally:
            self._left_wait_at = time.monotonic()

    def poll(self, wait_seconds: float = 0.0) -> int:
        """Read the terminal cursor once (long-polling up to `wait_seconds`) and collect what
        of ours finished; returns how many did."""
        if self._cursor is None:
            raise RuntimeError("nothing to poll for: submit() rollouts first")
        polled = self.client.long_poll_terminal(self._cursor, wait_seconds)
        page = polled.value
        mine = [item for item in page.items if item.rollout_id in self._pending]
        if not page.items and not polled.long_polled and wait_seconds > 0:
            time.sleep(min(1.0, wait_seconds))  # a Gateway without long-polls answered at once
        if mine:
            if self.hooks is not None:
                self.hooks.run_terminal(mine)  # what they write is on the Gateway before the fetch
            self._collect(mine)
            if self.hooks is not None:
                self.hooks.collected(mine)
        # Only now: if a fetch failed, the next poll reads the same page again.
        self._cursor = page.next_after
        return len(mine)

    def _collect(self, items: Sequence[TerminalItem]) -> None:
        chunks = [items[i : i + FETCH_BATCH] for i in range(0, len(items), FETCH_BATCH)]
        collected: list[str] = []
        try:
            with gc_paused():  # parsing millions of token ids makes no cycles (see gcpause)
                for rollouts in self._pool.map(self._fetch_chunk, chunks):
                    for rollout in rollouts:
                        self._done[rollout.rollout_id] = rollout
                        self._finish_seq[rollout.rollout_id] = next(self._finish_counter)
                        self._pending.pop(rollout.rollout_id, None)
                        collected.append(rollout.rollout_id)
                        self._n_collected += 1
        finally:  # also when a later chunk failed: what was read is ours and can go
            if collected:
                self._last_progress = time.monotonic()
                if not self.config.agl.keep_rollouts:
                    self._keep_newest(collected)
        self._reap_deletions()

    def _fetch_chunk(self, items: Sequence[TerminalItem]) -> list[CollectedRollout]:
        """Events of several finished rollouts: one batch request, or one each from a v1.0 Gateway."""
        if self._batch_routes is not False:
            delta = self._delta_format
            try:
                answers = self.client.get_events_batch(
                    [item.rollout_id for item in items], format="triplet_delta" if delta else "triplet"
                )
            except BadRequest:
                if not delta:
                    raise
                self._delta_format = False  # a Gateway from before the format: whole triplets
                return self._fetch_chunk(items)
            except (NotFound, GatewayError) as exc:
                if isinstance(exc, NotFound) or exc.status_code == 405:
                    self._batch_routes = False  # no batch routes (v1.0): one request per rollout
                else:
                    raise
            else:
                self._batch_routes = True
                if delta:
                    for a in answers:
                        expand_prompt_refs(a["events"], lazy=True)
                return [
                    self._collected(item, a["events"], a.get("error_message"), a.get("outcome"))
                    if a["found"]
                    else self._collected(item, [], DELETED_BEFORE_READ)
                    for item, a in zip(items, answers, strict=True)
                ]
        return [self._fetch_one(item) for item in items]

    def _fetch_one(self, item: TerminalItem) -> CollectedRollout:
        try:
            events = self.client.get_events_json(item.rollout_id, format="triplet")
            error_message = None
            if item.state != RolloutState.SUCCEEDED:
                error_message = self.client.get_rollout(item.rollout_id).rollout.status.error_message
        except NotFound:
            return self._collected(item, [], DELETED_BEFORE_READ)
        return self._collected(item, events, error_message)

    def _collected(
        self,
        item: TerminalItem,
        events: list[dict[str, Any]],
        error_message: str | None,
        outcome: str | None = None,
    ) -> CollectedRollout:
        p = self._pending[item.rollout_id]
        state = RolloutState(item.state)
        return CollectedRollout(
            rollout_id=p.rollout_id,
            group_id=p.group_id,
            state=state,
            events=events,
            is_train=p.is_train,
            step=p.step,
            sample_idx=p.sample_idx,
            index_in_group=p.index_in_group,
            error_message=error_message if state != RolloutState.SUCCEEDED else None,
            lost=p.lost,
            input=p.input,
            outcome=AttemptOutcome(outcome) if outcome in OUTCOME_NAMES else None,
        )

    # Deletes free the Gateway's storage and nothing needs to wait for them. They are sent when
    # the trainer next waits for rollouts, and run in the background: not while it builds the
    # batch, when the Gateway's work (~2 ms of CPU per rollout with SQLite) would compete.

    def _keep_newest(self, rollout_ids: list[str]) -> None:
        """Leave the newest `keep_last_rollouts` collected rollouts on the Gateway, so that the
        dashboard shows the run's last ones after it ends; the older ones are deleted."""
        self._kept.extend(rollout_ids)
        over = len(self._kept) - self.config.agl.keep_last_rollouts
        if over > 0:
            self._delete_later([self._kept.popleft() for _ in range(over)])

    def _delete_later(self, rollout_ids: list[str]) -> None:
        self._to_delete.extend(rollout_ids)

    def _start_deletions(self) -> None:
        if self._to_delete:
            self._deletions.append(self._pool.submit(self._delete, self._to_delete))
            self._to_delete = []

    def _delete(self, rollout_ids: list[str]) -> int:
        if self._batch_routes:
            n = 0
            for start in range(0, len(rollout_ids), MAX_BATCH_IDS):
                n += self.client.delete_rollouts(rollout_ids[start : start + MAX_BATCH_IDS])
            return n
        for rollout_id in rollout_ids:
            self.client.delete_rollout(rollout_id)
        return len(rollout_ids)

    def _reap_deletions(self, wait: bool = False) -> None:
        """Check finished background deletes (all of them with `wait`); a failed one is logged."""
        still: list[Future[int]] = []
        for future in self._deletions:
            if not wait and not future.done():
                still.append(future)
                continue
            try:
                self.n_deleted += future.result()
            except Exception as exc:  # the rollouts stay on the Gateway; training goes on
                log.warning("delete_failed", error=f"{type(exc).__name__}: {exc}")
        self._deletions = still

    def flush_deletions(self) -> int:
        """Delete what is due now and wait; returns how many rollouts this manager deleted so far."""
        self._start_deletions()
        self._reap_deletions(wait=True)
        return self.n_deleted

    def _check_claimed(self) -> None:
        """Warn once when every rollout still pending since the last submission is still queued
        and none of them finished: nothing is taking this Gateway's rollouts."""
        self._claim_check_at = None
        if not self._pending or self._n_collected > self._n_collected_at_submit:
            return
        queued = self.client.list_rollouts([RolloutState.QUEUING], limit=LIST_LIMIT)
        queued_ids = {r.rollout_id for r in queued}
        if len(queued) < LIST_LIMIT and all(rid in queued_ids for rid in self._pending):
            agl = self.config.agl
            log.warning(
                "rollouts_not_claimed",
                detail=(
                    f"none of the {len(self._pending)} rollouts queued on the Gateway at {agl.agl_base_url} "
                    f"was taken by an agent in {agl.unclaimed_warning_seconds:g}s: is a Controller running "
                    "for this Gateway? Start one (agl-controller agl_server.url=... agl_server.key=...) or "
                    "check its agl_server.url and its log; the rollouts fail after "
                    f"{self._stall_seconds:.0f}s (agentlightning.rollout_timeout_seconds + rollout_grace_seconds)"
                ),
            )

    def _check_lost(self) -> None:
        """Fail the rollouts that will not finish by themselves (see the module docstring)."""
        self._last_lost_check = time.monotonic()
        stalled = time.monotonic() - self._last_progress > self._stall_seconds
        active = self.client.list_rollouts([RolloutState.QUEUING, RolloutState.RUNNING], limit=LIST_LIMIT)
        by_id = {r.rollout_id: r for r in active}
        now = time.time()
        lost: list[tuple[str, str]] = []
        missing: list[str] = []
        for rollout_id, p in self._pending.items():
            if p.lost:
                continue
            r = by_id.get(rollout_id)
            if r is None:
                if len(active) < LIST_LIMIT:
                    missing.append(rollout_id)
            elif r.status.state == RolloutState.RUNNING and now - r.status.updated_at > self._stall_seconds:
                lost.append((rollout_id, f"running for over {self._stall_seconds:.0f}s (timeout + grace)"))
            elif stalled:
                lost.append(
                    (rollout_id, f"no rollout finished for {self._stall_seconds:.0f}s (timeout + grace)")
                )
        vanished: list[TerminalItem] = []
        for rollout_id in missing:  # finished since (the cursor will bring it) or gone from the Gateway
            try:
                self.client.get_rollout(rollout_id)
            except NotFound:
                self._pending[rollout_id].lost = True
                vanished.append(TerminalItem(rollout_id=rollout_id, state=RolloutState.FAILED))
        for rollout_id, why in lost:
            try:
                # The evidence first: the Gateway keeps it for the attempt the trainer gave up on.
                with contextlib.suppress(NotFound, BadRequest):  # a v1.0 Gateway has no outcomes
                    attempt = by_id[rollout_id].status.last_attempt_id
                    self.client.report_outcome(
                        rollout_id, attempt, AttemptOutcome.LOST, f"failed by the trainer: {why}"
                    )
                self.client.patch_rollout(
                    rollout_id, state=RolloutState.FAILED, error_message=f"failed by the trainer: {why}"
                )
            except Conflict:
                continue  # it just finished; the cursor brings it
            except NotFound:
                vanished.append(TerminalItem(rollout_id=rollout_id, state=RolloutState.FAILED))
            self._pending[rollout_id].lost = True
        if lost or vanished:
            self.n_lost_total += len(lost) + len(vanished)
            log.warning(
                "rollouts_lost",
                failed_by_trainer=len(lost),
                vanished=len(vanished),
                examples=[rid for rid, _ in lost[:3]] + [v.rollout_id for v in vanished[:3]],
            )
        for item in vanished:
            p = self._pending.pop(item.rollout_id)
            self._done[p.rollout_id] = CollectedRollout(
                rollout_id=p.rollout_id,
                group_id=p.group_id,
                state=RolloutState.FAILED,
                is_train=p.is_train,
                step=p.step,
                sample_idx=p.sample_idx,
                index_in_group=p.index_in_group,
                error_message="the rollout disappeared from the Gateway",
                lost=True,
                outcome=AttemptOutcome.LOST,
                input=p.input,
            )
            self._finish_seq[p.rollout_id] = next(self._finish_counter)
        if lost or vanished:
            self._last_progress = time.monotonic()

    # --- taking results -------------------------------------------------------------------

    def take(self, rollout_ids: Iterable[str]) -> list[CollectedRollout]:
        """Hand over collected rollouts (and forget them). Raises KeyError for one not collected."""
        taken = [self._done.pop(rid) for rid in rollout_ids]
        for rollout in taken:
            self._finish_seq.pop(rollout.rollout_id, None)
        return taken

    def collect(
        self, samples: Sequence[Any], step: int, is_train: bool = True, n: int | None = None
    ) -> tuple[list[CollectedRollout], dict[str, float]]:
        """Submit rollouts for `samples` and wait for all of them (sync mode)."""
        started = time.perf_counter()
        groups = self.submit(samples, step, is_train, n)
        ids = [rid for g in groups for rid in g.rollout_ids]
        self.wait(lambda: all(rid in self._done for rid in ids))
        rollouts = self.take(ids)
        return rollouts, {"timing/collect_s": time.perf_counter() - started}

    def abandon(self) -> int:
        """Fail and delete every rollout still pending, finish the due deletes (at shutdown);
        returns how many were pending."""
        ids = list(self._pending)
        for rollout_id in ids:
            try:
                self.client.patch_rollout(
                    rollout_id, state=RolloutState.FAILED, error_message="trainer stopped"
                )
            except (Conflict, NotFound):
                pass
        if ids and not self.config.agl.keep_rollouts:
            self._delete(ids)
        self._pending.clear()
        self.flush_deletions()
        return len(ids)
