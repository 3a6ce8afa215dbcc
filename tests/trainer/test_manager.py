"""The rollout manager against a real Gateway process."""

from __future__ import annotations

import base64
import threading
import time
from collections import Counter

import httpx
import pytest

from agentlightning.aggregation import aggregate_rollout
from agentlightning.client import GatewayClient, NotFound, RetryPolicy, ServerError
from agentlightning.schemas import RolloutState
from agentlightning.trainer.batch import build_training_batch
from agentlightning.trainer.config import load_core_config
from agentlightning.trainer.manager import RolloutManager
from tests.conftest import trainer_key
from tests.trainer.driver import Driver, finish, raw_call, two_turn_calls


def _config(gateway, **agl):
    return load_core_config(
        {
            "data": {"train_batch_size": 2},
            "actor_rollout_ref": {"rollout": {"n": 3}, "actor": {"ppo_mini_batch_size": 1}},
            "agentlightning": {
                "agl_base_url": gateway.url,
                "agl_key": gateway.key,
                "poll_wait_seconds": 5,
                "keep_last_rollouts": 0,  # these tests see each collected rollout deleted
                **agl,
            },
        }
    )


def _count_requests(client: GatewayClient) -> Counter[str]:
    """Count the client's requests by 'METHOD path-shape' (ids replaced by {id})."""
    counts: Counter[str] = Counter()
    lock = threading.Lock()

    def hook(request: httpx.Request) -> None:
        parts = request.url.path.split("/")
        if len(parts) > 3 and parts[1:3] == ["api", "rollouts"] and parts[3] not in ("terminal", "batch"):
            parts[3] = "{id}"
        with lock:
            counts[f"{request.method} {'/'.join(parts)}"] += 1

    client._http.event_hooks["request"] = [hook]
    return counts


def test_submit_creates_groups_with_ids_metadata_and_rollout_config(gateway, tmp_path):
    template = tmp_path / "job.j2"
    template.write_text("apiVersion: batch/v1\nkind: Job\n")
    cfg = _config(
        gateway,
        rollout_timeout_seconds=42,
        local={"agent_class": "my.agents:Solver", "env_map": {"QUESTION": "input.question"}},
        k8s={"job_template_path": str(template)},
    )
    with RolloutManager(cfg) as manager:
        groups = manager.submit([{"question": "1+1"}, {"question": "2+2"}], step=7)
        assert [len(g.rollout_ids) for g in groups] == [3, 3]
        assert len({g.group_id for g in groups}) == 2
        stored = {r.rollout_id: r for r in manager.client.list_rollouts()}
        assert len(stored) == 6
        for g in groups:
            for j, rid in enumerate(g.rollout_ids):
                r = stored[rid]
                assert r.metadata.data_id == g.group_id
                assert (r.metadata.batch_idx, r.metadata.sample_idx_in_batch) == (7, g.sample_idx)
                assert trainer_key(r, "index_in_group") == j
                assert r.input == [{"question": "1+1"}, {"question": "2+2"}][g.sample_idx]
                assert r.config.timeout_seconds == 42
                assert r.config.local is not None and r.config.k8s is not None
                assert r.config.local.agent_class == "my.agents:Solver"
                assert r.config.local.env_map == {"QUESTION": "input.question"}
                assert r.config.k8s.job_template == "apiVersion: batch/v1\nkind: Job\n"
        # a second submit never reuses a group id
        again = manager.submit([{"question": "1+1"}], step=7)
        assert again[0].group_id not in {g.group_id for g in groups}
        assert len(manager.client.list_rollouts()) == 9
        manager.abandon()
        assert manager.client.list_rollouts() == []


def test_collect_reads_the_terminal_cursor_fetches_triplets_and_deletes(gateway):
    cfg = _config(gateway)
    rewards = {0: 1.0, 1: 0.0, 2: 0.5}

    def plan(rollout):
        j = rollout.metadata.model_extra["index_in_group"]
        if rollout.input["k"] == 1 and j == 2:
            return two_turn_calls(j), None, RolloutState.FAILED
        return two_turn_calls(j, version=0), rewards[j], RolloutState.SUCCEEDED

    with RolloutManager(cfg) as manager, Driver(gateway.url, gateway.key, plan):
        counts = _count_requests(manager.client)
        rollouts, metrics = manager.collect([{"k": 0}, {"k": 1}], step=0)
        assert manager.flush_deletions() == 6
    assert len(rollouts) == 6 and metrics["timing/collect_s"] > 0
    by_id = {r.rollout_id: r for r in rollouts}
    failed = [r for r in rollouts if r.failed]
    assert len(failed) == 1 and failed[0].state == RolloutState.FAILED
    for r in rollouts:
        kinds = [e["event_type"] for e in r.events]
        assert kinds.count("model_request") == 2
        assert set(r.events[0]["data"]) >= {"prompt_token_ids", "response_token_ids", "response_log_probs"}
    assert len(by_id) == 6
    # batch reads and deletes; no per-rollout requests at all, no state polling
    assert 1 <= counts["POST /api/rollouts/batch/events"] <= 6
    assert 1 <= counts["POST /api/rollouts/batch/delete"] <= 6
    assert not [k for k in counts if "{id}" in k]
    assert counts["GET /api/rollouts/terminal"] <= 8
    with GatewayClient(gateway.url, gateway.key) as client:
        assert client.list_rollouts() == []

    batch = build_training_batch(rollouts, cfg, step=0, policy_version=0)
    assert len(batch.rows) == 5  # the failed rollout is dropped
    row = next(r for r in batch.rows if r.rollout_id.endswith("-0"))
    assert row.response_mask == [1, 1, 0, 0, 1] and row.reward == 1.0


def test_keep_rollouts_leaves_them_on_the_gateway(gateway):
    cfg = _config(gateway, keep_rollouts=True)
    with (
        RolloutManager(cfg) as manager,
        Driver(gateway.url, gateway.key, lambda r: ([], 1.0, RolloutState.SUCCEEDED)),
    ):
        rollouts, _ = manager.collect([{"k": 0}], step=0, n=2)
        assert {r.rollout_id for r in manager.client.list_rollouts()} == {r.rollout_id for r in rollouts}


def test_the_newest_collected_rollouts_stay_for_the_dashboard_the_older_are_deleted(gateway):
    cfg = _config(gateway, keep_last_rollouts=3)
    with (
        RolloutManager(cfg) as manager,
        Driver(gateway.url, gateway.key, lambda r: ([], 1.0, RolloutState.SUCCEEDED)),
    ):
        first, _ = manager.collect([{"k": 0}], step=0, n=2)
        assert manager.flush_deletions() == 0  # 2 collected: under the bound
        second, _ = manager.collect([{"k": 1}], step=1, n=2)
        third, _ = manager.collect([{"k": 2}], step=2, n=2)
        assert manager.flush_deletions() == 3  # 6 collected, 3 kept
    with GatewayClient(gateway.url, gateway.key) as client:
        left = {r.rollout_id for r in client.list_rollouts()}
    collected = [r.rollout_id for r in first + second + third]
    assert len(left) == 3 and left <= set(collected)
    assert {r.rollout_id for r in third} <= left  # the last step's are among the newest
    assert not {r.rollout_id for r in first} & left  # the oldest went


def test_keep_last_rollouts_must_be_a_count():
    with pytest.raises(ValueError, match=r"agentlightning.keep_last_rollouts must be >= 0, got -1"):
        load_core_config({"agentlightning": {"keep_last_rollouts": -1}})


def test_failed_rollouts_report_their_error_message(gateway):
    cfg = _config(gateway)
    with RolloutManager(cfg) as manager:
        (group,) = manager.submit([{"k": 0}], step=0, n=1)
        finish(
            manager.client, group.rollout_ids[0], [], None, RolloutState.FAILED, error_message="agent crashed"
        )
        manager.wait(lambda: manager.is_done(group.rollout_ids[0]), timeout=30)
        (rollout,) = manager.take(group.rollout_ids)
    assert rollout.failed and rollout.error_message == "agent crashed" and not rollout.lost


def test_lost_rollouts_are_failed_by_the_trainer_and_reported(gateway):
    cfg = _config(gateway, rollout_timeout_seconds=1, rollout_grace_seconds=0)
    with RolloutManager(cfg) as manager:
        groups = manager.submit([{"k": 0}], step=0, n=2)
        running, queued = groups[0].rollout_ids
        manager.client.patch_rollout(running, state=RolloutState.RUNNING, last_attempt_id="a1")
        assert manager.wait(lambda: manager.is_done(running) and manager.is_done(queued), timeout=30)
        got = {r.rollout_id: r for r in manager.take([running, queued])}
        assert manager.n_lost_total == 2
        assert manager.flush_deletions() == 2
        with GatewayClient(gateway.url, gateway.key) as client:
            for rid in (running, queued):
                with pytest.raises(NotFound):  # failed, collected, then deleted
                    client.get_rollout(rid)
    assert all(r.lost and r.state == RolloutState.FAILED for r in got.values())
    batch = build_training_batch(got.values(), cfg, step=0)
    assert batch.metrics["training/n_rollouts_lost"] == 2 and batch.rows == []


def test_lost_rollout_messages_say_why(gateway):
    cfg = _config(gateway, rollout_timeout_seconds=1, rollout_grace_seconds=0, keep_rollouts=True)
    with RolloutManager(cfg) as manager:
        (group,) = manager.submit([{"k": 0}], step=0, n=2)
        running, queued = group.rollout_ids
        manager.client.patch_rollout(running, state=RolloutState.RUNNING, last_attempt_id="a1")
        assert manager.wait(lambda: manager.is_done(running) and manager.is_done(queued), timeout=30)
        got = {r.rollout_id: r for r in manager.take([running, queued])}
        messages = {rid: manager.client.get_rollout(rid).rollout.status.error_message for rid in got}
        lost_attempt = manager.client.get_rollout(running).attempt_details
    assert "running for over 1s" in (messages[running] or "")
    assert "no rollout finished" in (messages[queued] or "")
    assert all(r.error_message == messages[r.rollout_id] for r in got.values())
    # recorded as the trainer's evidence (docs/reliability.md), for the attempt it gave up on
    assert all(r.outcome == "lost" for r in got.values())
    assert [(a.attempt_id, a.outcome) for a in lost_attempt] == [("a1", "lost")]


def test_a_rollout_deleted_behind_the_trainers_back_is_reported_lost(gateway):
    cfg = _config(gateway, rollout_timeout_seconds=1, rollout_grace_seconds=0)
    with RolloutManager(cfg) as manager:
        (group,) = manager.submit([{"k": 0}], step=0, n=1)
        manager.client.delete_rollout(group.rollout_ids[0])
        assert manager.wait(lambda: manager.is_done(group.rollout_ids[0]), timeout=30)
        (rollout,) = manager.take(group.rollout_ids)
    assert rollout.lost and rollout.failed and rollout.events == []


def test_non_json_sample_is_a_clear_error(gateway):
    with RolloutManager(_config(gateway)) as manager, pytest.raises(ValueError, match="JSON"):
        manager.submit([object()], step=0)


class _NoBatchRoutes(httpx.HTTPTransport):
    """A v1.0 Gateway: the batch routes do not exist."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if "/batch/" in request.url.path:
            return httpx.Response(405, json={"detail": "Method Not Allowed"})
        return super().handle_request(request)


def test_without_batch_routes_it_reads_and_deletes_one_rollout_at_a_time(gateway):
    cfg = _config(gateway)

    def plan(rollout):
        if rollout.input["k"] == 1:
            return [], None, RolloutState.FAILED
        return two_turn_calls(0), 1.0, RolloutState.SUCCEEDED

    client = GatewayClient(gateway.url, gateway.key, transport=_NoBatchRoutes())
    with RolloutManager(cfg, client=client) as manager, Driver(gateway.url, gateway.key, plan):
        counts = _count_requests(manager.client)
        rollouts, _ = manager.collect([{"k": 0}, {"k": 1}], step=0, n=2)
        assert manager.flush_deletions() == 4
    assert counts["GET /api/rollouts/{id}/events"] == 4
    assert counts["GET /api/rollouts/{id}"] == 2  # error messages of the failed ones
    assert counts["DELETE /api/rollouts/{id}"] == 4
    assert sorted(len(r.events) for r in rollouts) == [0, 0, 3, 3]
    assert all(r.failed == (r.input["k"] == 1) for r in rollouts)
    with GatewayClient(gateway.url, gateway.key) as c:
        assert c.list_rollouts() == []


def test_time_spent_outside_wait_does_not_count_as_a_stall(gateway):
    """Async carry-over rollouts stay pending while the trainer trains; that is no stall."""
    cfg = _config(gateway, rollout_timeout_seconds=1, rollout_grace_seconds=0)
    with RolloutManager(cfg) as manager:
        (group,) = manager.submit([{"k": 0}], step=0, n=1)
        rid = group.rollout_ids[0]
        assert not manager.wait(lambda: manager.is_done(rid), timeout=0.1)
        time.sleep(1.5)  # "training", longer than timeout + grace
        finisher = threading.Timer(0.3, finish, args=(manager.client, rid, two_turn_calls(0), 1.0))
        finisher.start()
        assert manager.wait(lambda: manager.is_done(rid), timeout=30)
        finisher.join()
        (rollout,) = manager.take([rid])
    assert not rollout.lost and not rollout.failed and manager.n_lost_total == 0


class _FailOnce(httpx.HTTPTransport):
    """The first batch read fails with a 503."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/batch/events") and not self.failed:
            self.failed = True
            return httpx.Response(503, json={"detail": "try later"})
        return super().handle_request(request)


def test_a_failed_fetch_loses_nothing_the_next_wait_reads_it_again(gateway):
    cfg = _config(gateway)
    client = GatewayClient(gateway.url, gateway.key, retry=RetryPolicy(attempts=1), transport=_FailOnce())
    with RolloutManager(cfg, client=client) as manager:
        (group,) = manager.submit([{"k": 0}], step=0, n=2)
        for rid in group.rollout_ids:
            finish(manager.client, rid, two_turn_calls(0), 1.0)
        with pytest.raises(ServerError):
            manager.wait(lambda: all(manager.is_done(r) for r in group.rollout_ids), timeout=30)
        assert manager.wait(lambda: all(manager.is_done(r) for r in group.rollout_ids), timeout=30)
        rollouts = manager.take(group.rollout_ids)
        assert manager.flush_deletions() == 2
    assert all(len(r.events) == 3 for r in rollouts)


def test_submit_registers_the_current_endpoints_again(gateway):
    with RolloutManager(_config(gateway)) as manager:
        manager.register_endpoints(["127.0.0.1:9001"], version=3)
        manager.client.delete_models()  # e.g. a Gateway restarted with the memory store
        manager.submit([{"k": 0}], step=0, n=1)
        models = manager.client.list_models()
        manager.abandon()
    assert [(m.model, m.endpoint, m.version) for m in models] == [("policy", "http://127.0.0.1:9001/v1", 3)]


def _long_calls(seed: int) -> list[dict]:
    """Six calls, each extending the last, one retried and one failed in between."""
    calls = []
    prompt = [*range(1000, 1600), seed]  # long enough to be stored as deltas
    for t in range(6):
        response = [20 + t, 21 + seed]
        calls.append(raw_call(prompt, response, [-0.5, -0.25], 0))
        if t == 2:
            calls.append(raw_call(prompt, response, [-0.5, -0.25], 0))  # a retry: same prompt
            calls.append({"response": None, "http_status": 502, "status": "error", "error": "boom"})
        prompt = prompt + response + [90 + t] * 3
    return calls


def test_collects_in_the_delta_format_and_rebuilds_the_triplet_view(gateway):
    cfg = _config(gateway, keep_rollouts=True)
    bodies: list[bytes] = []

    def plan(rollout):
        return _long_calls(rollout.metadata.model_extra["index_in_group"]), 1.0, RolloutState.SUCCEEDED

    with RolloutManager(cfg) as manager, Driver(gateway.url, gateway.key, plan):
        manager.client._http.event_hooks["request"] = [
            lambda r: bodies.append(r.content) if r.url.path.endswith("/batch/events") else None
        ]
        rollouts, _ = manager.collect([{"k": 0}], step=0)
    assert bodies and all(b'"triplet_delta"' in b for b in bodies)
    with GatewayClient(gateway.url, gateway.key) as client:
        whole = client.get_events_batch([r.rollout_id for r in rollouts], format="triplet")
        delta = client.get_events_batch([r.rollout_id for r in rollouts], format="triplet_delta")
    for rollout, answer, answer_delta in zip(rollouts, whole, delta, strict=True):
        assert rollout.events == answer["events"]
        calls = [e["data"] for e in answer_delta["events"] if e["event_type"] == "model_request"]
        # the first call whole, each later one a reference and only its new ids
        ok = [c for c in calls if c.get("status") != "error"]
        assert ok[0]["prompt_ref"] is None and all(c["prompt_ref"] is not None for c in ok[1:])
        assert all(len(base64.b64decode(c["prompt_suffix"])) == 5 * 4 for c in ok[1:])
    for r in rollouts:
        (row,) = aggregate_rollout(r.events, r.rollout_id, r.group_id, 1.0)
        assert row.n_calls == 6 and len(row.prompt_ids) == 601


class _NoDeltaFormat(httpx.HTTPTransport):
    """A Gateway from before the triplet_delta format: its batch route refuses it (422)."""

    def __init__(self) -> None:
        super().__init__()
        self.refused = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/batch/events") and b'"triplet_delta"' in request.content:
            self.refused += 1
            return httpx.Response(422, json={"detail": [{"loc": ["body", "format"], "msg": "bad"}]})
        return super().handle_request(request)


def test_a_gateway_without_the_delta_format_is_read_in_the_triplet_format(gateway):
    cfg = _config(gateway)
    transport = _NoDeltaFormat()
    client = GatewayClient(gateway.url, gateway.key, transport=transport)
    plan = lambda rollout: (_long_calls(0), 1.0, RolloutState.SUCCEEDED)  # noqa: E731
    with RolloutManager(cfg, client=client) as manager, Driver(gateway.url, gateway.key, plan):
        rollouts, _ = manager.collect([{"k": 0}, {"k": 1}], step=0)
    assert transport.refused == 1  # asked once, then remembered
    assert all(sum(e["event_type"] == "model_request" for e in r.events) == 7 for r in rollouts)
    assert all(len(aggregate_rollout(r.events, r.rollout_id, r.group_id, 1.0)) == 1 for r in rollouts)


def test_rollouts_nobody_takes_are_said_within_the_warning_time(gateway, capfd):
    # No Controller: the rollouts stay queued. The warning comes at unclaimed_warning_seconds, long
    # before the stall check (timeout + grace) would fail them.
    cfg = _config(gateway, unclaimed_warning_seconds=0.5, rollout_timeout_seconds=600)
    with RolloutManager(cfg) as manager:
        manager.submit([{"k": 0}], step=3, n=2)
        started = time.monotonic()
        assert not manager.wait(lambda: False, timeout=4)
        assert time.monotonic() - started >= 4  # the warning did not end the wait
    out = "".join(capfd.readouterr())
    assert out.count("rollouts_not_claimed") == 1  # once, not once per poll
    assert "none of the 2 rollouts queued on the Gateway" in out
    assert "is a Controller running for this Gateway?" in out


def test_no_warning_once_an_agent_took_a_rollout(gateway, capfd):
    cfg = _config(gateway, unclaimed_warning_seconds=0.5, rollout_timeout_seconds=600)
    with RolloutManager(cfg) as manager:
        (group,) = manager.submit([{"k": 0}], step=0, n=2)
        manager.client.patch_rollout(group.rollout_ids[0], state=RolloutState.RUNNING, last_attempt_id="a1")
        assert not manager.wait(lambda: False, timeout=2)
    assert "rollouts_not_claimed" not in "".join(capfd.readouterr())


def test_a_clean_stop_removes_the_trainers_endpoints_and_no_other(gateway):
    with GatewayClient(gateway.url, gateway.key) as client:
        with RolloutManager(_config(gateway, endpoint_lease_seconds=60)) as manager:
            manager.register_endpoints(["127.0.0.1:9"], version=3)
            client.register_models([{"model": "judge", "endpoint": "http://127.0.0.1:8/v1"}])  # not ours
            (ours,) = [m for m in client.list_models() if m.model == "policy"]
            assert ours.version == 3 and ours.lease_seconds == 60 and ours.expires_at is not None
        assert [(m.model, m.endpoint) for m in client.list_models()] == [("judge", "http://127.0.0.1:8/v1")]


KILLED_TRAINER = """
import sys, threading
from agentlightning.trainer.config import load_core_config
from agentlightning.trainer.manager import RolloutManager
url, key = sys.argv[1:3]
cfg = load_core_config({"agentlightning": {"agl_base_url": url, "agl_key": key, "endpoint_lease_seconds": 2}})
manager = RolloutManager(cfg)
manager.register_endpoints(["127.0.0.1:9"], version=1)
print("registered", flush=True)
threading.Event().wait()
"""


@pytest.mark.process
def test_a_killed_trainers_endpoints_expire_with_their_lease(gateway):
    import signal
    import subprocess
    import sys

    lease = 2.0
    trainer = subprocess.Popen(
        [sys.executable, "-c", KILLED_TRAINER, gateway.url, gateway.key], stdout=subprocess.PIPE, text=True
    )
    try:
        assert trainer.stdout is not None
        lines = iter(trainer.stdout.readline, "")  # its log lines come first
        assert any(line.strip() == "registered" for line in lines), "the trainer ended before registering"
        with GatewayClient(gateway.url, gateway.key) as client:
            # Alive, it renews: still there after more than one lease.
            started = time.monotonic()
            while time.monotonic() - started < 2.5 * lease:
                assert [m.endpoint for m in client.list_models()] == ["http://127.0.0.1:9/v1"]
                time.sleep(0.2)
            trainer.send_signal(signal.SIGKILL)
            trainer.wait(timeout=30)
            killed = time.monotonic()
            while client.list_models():
                assert time.monotonic() - killed < 30, "the killed trainer's endpoint stayed registered"
                time.sleep(0.1)
            assert time.monotonic() - killed <= lease + 5  # within its lease (and a busy machine's slack)
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()
