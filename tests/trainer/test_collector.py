"""Sync and async collection against a real Gateway process."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agentlightning.schemas import RolloutState
from agentlightning.trainer.collected import CollectedRollout
from agentlightning.trainer.collector import AsyncCollector, SyncCollector, make_collector
from agentlightning.trainer.config import load_core_config
from agentlightning.trainer.manager import Group, RolloutManager
from tests.trainer.driver import Driver, OrderedDriver, finish, two_turn_calls


def _config(gateway, async_enabled: bool, **agl):
    return load_core_config(
        {
            "data": {"train_batch_size": 2},
            "actor_rollout_ref": {"rollout": {"n": 2}, "actor": {"ppo_mini_batch_size": 1}},
            "agentlightning": {
                "agl_base_url": gateway.url,
                "agl_key": gateway.key,
                "poll_wait_seconds": 5,
                "async_rollout": {"enabled": async_enabled, "async_train_batch_size": 3},
                "keep_last_rollouts": 0,  # nothing left on the Gateway once the run ends
                **agl,
            },
        }
    )


class Prompts:
    def __init__(self) -> None:
        self.served = 0

    def __call__(self, k: int) -> list[dict[str, str]]:
        names = [chr(ord("A") + self.served + i) for i in range(k)]
        self.served += k
        return [{"name": n} for n in names]


def _finish_cmd(name: str, index: int, reward: float = 1.0):
    def match(rollout) -> bool:
        return rollout.input["name"] == name and rollout.metadata.model_extra["index_in_group"] == index

    def act(client, rollout) -> None:
        finish(client, rollout.rollout_id, two_turn_calls(index), reward)

    return match, act


def _names(rollouts) -> list[str]:
    return sorted({r.input["name"] for r in rollouts})


def test_sync_collector_takes_a_full_batch(gateway):
    cfg = _config(gateway, async_enabled=False)
    with (
        RolloutManager(cfg) as manager,
        Driver(gateway.url, gateway.key, lambda r: ([], 1.0, RolloutState.SUCCEEDED)),
    ):
        collector = make_collector(manager)
        assert isinstance(collector, SyncCollector)
        rollouts, _ = collector.collect(Prompts(), step=0)
    assert _names(rollouts) == ["A", "B"] and len(rollouts) == 4


def test_async_collector_hands_out_first_complete_groups_and_carries_the_rest(gateway):
    cfg = _config(gateway, async_enabled=True)
    prompts = Prompts()
    with RolloutManager(cfg) as manager, OrderedDriver(gateway.url, gateway.key) as driver:
        collector = make_collector(manager)
        assert isinstance(collector, AsyncCollector)
        # step 0: A, B, C in flight; B completes first, then C; A is half done
        for cmd in [("B", 0), ("B", 1), ("A", 0), ("C", 1), ("C", 0)]:
            driver.commands.put(_finish_cmd(*cmd))
        rollouts, metrics = collector.collect(prompts, step=0)
        assert _names(rollouts) == ["B", "C"] and len(rollouts) == 4
        assert [g.sample_idx for g in collector.in_flight] == [0]  # A, whole, carried over
        assert metrics["training/async/n_prev_carry_over_rollouts"] == 0
        assert metrics["training/async/n_completed_rollouts"] == 4
        assert metrics["training/async/n_new_carry_over_rollouts"] == 2
        assert metrics["training/async/new_carry_over_age_max_steps"] == 0

        # step 1: topped up with D, E; A completes, then E; D stays in flight
        for cmd in [("A", 1), ("E", 0), ("D", 0), ("E", 1)]:
            driver.commands.put(_finish_cmd(*cmd))
        rollouts, metrics = collector.collect(prompts, step=1)
        assert prompts.served == 5
        assert _names(rollouts) == ["A", "E"]
        a = [r for r in rollouts if r.input["name"] == "A"]
        assert {r.step for r in a} == {0} and len(a) == 2  # A kept its age and both rollouts
        assert metrics["training/async/n_prev_carry_over_rollouts"] == 2
        assert metrics["training/async/taken_group_age_max_steps"] == 1
        assert metrics["training/async/n_new_carry_over_groups"] == 1
        assert metrics["training/async/new_carry_over_age_max_steps"] == 0
        assert collector.abandon() == 1  # D's unfinished rollout
        assert manager.client.list_rollouts() == []


# --- carry-over keeps groups whole: a property over completion orders, no Gateway needed ----


class _FakeManager:
    """Stands in for RolloutManager: rollouts finish in a random order, a few per poll (so more
    groups than asked for can complete at once)."""

    def __init__(self, config, order_seed: int) -> None:
        import random

        self.config = config
        self._rng = random.Random(order_seed)
        self._submitted: list[str] = []
        self._done: dict[str, CollectedRollout] = {}
        self._seq: dict[str, int] = {}
        self._counter = 0

    def submit(self, samples, step):
        groups = []
        for i, _ in enumerate(samples):
            gid = f"s{step}-g{self._counter}"
            self._counter += 1
            ids = tuple(f"{gid}-{j}" for j in range(self.config.rollout_n))
            self._submitted += ids
            groups.append(Group(gid, ids, step, i, True))
        return groups

    def is_done(self, rid: str) -> bool:
        return rid in self._done

    def finish_seq(self, rid: str) -> int:
        return self._seq[rid]

    def wait(self, until, timeout=None) -> bool:
        while not until():
            pending = [r for r in self._submitted if r not in self._done]
            if not pending:
                return False
            for rid in self._rng.sample(pending, min(len(pending), self._rng.randint(1, 3))):
                group_id = rid.rsplit("-", 1)[0]
                self._done[rid] = CollectedRollout(rid, group_id, RolloutState.SUCCEEDED)
                self._seq[rid] = len(self._seq)
        return True

    def take(self, ids):
        out = []
        for rid in ids:
            out.append(self._done.pop(rid))
            self._submitted.remove(rid)
        return out


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 4), st.integers(1, 3), st.integers(1, 4))
def test_async_carry_over_keeps_groups_whole(seed, train_batch, extra, n):
    cfg = load_core_config(
        {
            "data": {"train_batch_size": train_batch},
            "actor_rollout_ref": {"rollout": {"n": n}},
            "agentlightning": {
                "async_rollout": {"enabled": True, "async_train_batch_size": train_batch + extra}
            },
        }
    )
    manager = _FakeManager(cfg, seed)
    collector = AsyncCollector(manager)  # type: ignore[arg-type]
    taken_groups: set[str] = set()
    for step in range(4):
        rollouts, metrics = collector.collect(lambda k: [{}] * k, step)
        by_group: dict[str, list[str]] = {}
        for r in rollouts:
            by_group.setdefault(r.group_id, []).append(r.rollout_id)
        assert len(by_group) == train_batch
        assert all(len(v) == n for v in by_group.values())  # whole groups only
        assert not set(by_group) & taken_groups  # each group handed out once
        taken_groups |= set(by_group)
        assert len(collector.in_flight) == extra  # the rest carried over, whole
        assert all(len(g.rollout_ids) == n for g in collector.in_flight)
        # the groups handed out are the first to have completed
        completed_at = {g: max(manager.finish_seq(r) for r in rids) for g, rids in by_group.items()}
        for g in collector.in_flight:
            if all(manager.is_done(r) for r in g.rollout_ids):
                assert max(manager.finish_seq(r) for r in g.rollout_ids) > max(completed_at.values())
        assert metrics["training/async/n_new_carry_over_rollouts"] == extra * n


class _VersionedManager(_FakeManager):
    """Each rollout's one call is served by the policy version current when its group was made."""

    def __init__(self, config, order_seed: int) -> None:
        super().__init__(config, order_seed)
        self.policy_version = 0
        self._version: dict[str, int] = {}

    def submit(self, samples, step):
        groups = super().submit(samples, step)
        for g in groups:
            for rid in g.rollout_ids:
                self._version[rid] = self.policy_version
        return groups

    def take(self, ids):
        from tests.trainer.scripts import call_event

        return [
            CollectedRollout(
                r.rollout_id,
                r.group_id,
                RolloutState.SUCCEEDED,
                [call_event([1], [2], [0.0], self._version[r.rollout_id])],
            )
            for r in super().take(ids)
        ]


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 10**6))
def test_stale_policy_wait_discards_stale_groups_and_waits_for_fresh_ones(seed):
    cfg = load_core_config(
        {
            "data": {"train_batch_size": 2},
            "actor_rollout_ref": {"rollout": {"n": 2}},
            "agentlightning": {
                "max_staleness": 2,
                "stale_policy": "wait",
                "async_rollout": {"enabled": True, "async_train_batch_size": 4},
            },
        }
    )
    manager = _VersionedManager(cfg, seed)
    collector = AsyncCollector(manager)  # type: ignore[arg-type]
    collector.collect(lambda k: [{}] * k, 0)  # 4 groups made at version 0, 2 handed out, 2 carried
    manager.policy_version = 3  # the carried groups are now 3 versions behind: too stale
    rollouts, metrics = collector.collect(lambda k: [{}] * k, 1)
    assert len({r.group_id for r in rollouts}) == 2 and len(rollouts) == 4  # a full batch, whole groups
    assert all(manager._version[r.rollout_id] == 3 for r in rollouts)  # only fresh groups
    carried_stale = sum(1 for g in collector.in_flight if manager._version[g.rollout_ids[0]] == 0)
    assert metrics["training/staleness/n_groups_discarded_waiting"] + carried_stale == 2
    assert (
        metrics["training/staleness/n_rollouts_discarded_waiting"]
        == 2 * metrics["training/staleness/n_groups_discarded_waiting"]
    )
