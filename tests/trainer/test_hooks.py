"""v1.0's rollout hooks in the trainer core: a hooks file written against v1.0's RolloutHooks runs
unchanged; the reward its on_succeeded writes is the reward trained on; a raising hook is logged
with the rollout id and training goes on."""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from agentlightning.config.schema import ConfigError
from agentlightning.schemas import RolloutState
from agentlightning.trainer.batch import build_training_batch
from agentlightning.trainer.config import load_core_config
from agentlightning.trainer.manager import RolloutManager
from tests.trainer.driver import Driver, two_turn_calls

# Written for Agent Lightning v1.0.2 (its imports, base class and signatures): tests/compat also
# loads this very file with v1.0.2's own `load_hooks`.
HOOKS_V1 = """
from agentlightning.hooks import RolloutHooks
from agentlightning.schemas import RolloutCreate


class RewardFromTrace(RolloutHooks):
    def on_startup(self, store=None):
        self.seen = []

    def on_enqueue(self, request: RolloutCreate) -> RolloutCreate:
        # a per-sample config: harder questions get more time
        config = request.config.model_copy(update={"timeout_seconds": 60 * (1 + request.input["k"])})
        return request.model_copy(update={"config": config})

    def on_succeeded(self, rollout, events, store):
        if rollout.input.get("boom"):
            raise RuntimeError("the hook broke on purpose")
        attempt = rollout.status.last_attempt_id
        calls = [e for e in events[attempt] if e.event_type == "model_request"]
        agent_reward = [e.data["value"] for e in events[attempt] if e.event_type == "reward"]
        # the hook's reward: 10 per model call, plus what the agent said
        value = 10.0 * len(calls) + sum(agent_reward)
        store.add_event(rollout.rollout_id, attempt, "reward", {"value": value, "source": "hook"})

    def on_failed(self, rollout, store):
        store.add_event(rollout.rollout_id, rollout.status.last_attempt_id or "0", "hook_saw_failure", {})
"""


def _config(gateway, hooks: Path):
    return load_core_config(
        {
            "data": {"train_batch_size": 3},
            "actor_rollout_ref": {"rollout": {"n": 2}, "actor": {"ppo_mini_batch_size": 1}},
            "agentlightning": {
                "agl_base_url": gateway.url,
                "agl_key": gateway.key,
                "poll_wait_seconds": 5,
                "keep_rollouts": True,
                "hooks": str(hooks),
            },
        }
    )


def test_a_v1_hooks_file_sets_configs_and_the_reward_trained_on(gateway, tmp_path: Path) -> None:
    hooks = tmp_path / "hooks.py"
    hooks.write_text(HOOKS_V1)
    cfg = _config(gateway, hooks)

    def plan(rollout):
        if rollout.input.get("fail"):
            return two_turn_calls(1), None, RolloutState.FAILED
        return two_turn_calls(2), 0.5, RolloutState.SUCCEEDED  # the agent's own reward: 0.5

    samples = [{"k": 0}, {"k": 1, "boom": True}, {"k": 2, "fail": True}]
    with RolloutManager(cfg) as manager, Driver(gateway.url, gateway.key, plan), capture_logs() as logs:
        groups = manager.submit(samples, step=0)
        created = {r.rollout_id: r for r in manager.client.list_rollouts()}
        ids = [rid for g in groups for rid in g.rollout_ids]
        assert [created[rid].config.timeout_seconds for rid in ids] == [60, 60, 120, 120, 180, 180]
        manager.wait(lambda: all(manager.is_done(rid) for rid in ids))
        rollouts = manager.take(ids)
        events = {rid: manager.client.get_events(rid) for rid in ids}
    by_k = {r.rollout_id: r.input["k"] for r in rollouts}
    batch = build_training_batch(rollouts, cfg, step=0)
    rewards = {row.rollout_id: row.reward for row in batch.rows}
    for rid, k in by_k.items():
        kinds = [e.event_type for e in events[rid]]
        if k == 0:  # the hook's reward (2 calls * 10 + 0.5) is the one trained on
            assert rewards[rid] == 20.5 and kinds[-1] == "reward" and events[rid][-1].data["source"] == "hook"
        elif k == 1:  # the hook raised: logged, the agent's reward stands, training went on
            assert rewards[rid] == 0.5 and kinds.count("reward") == 1
        else:
            assert kinds[-1] == "hook_saw_failure" and rid not in rewards
    failures = [entry for entry in logs if entry["event"] == "hook_failed"]
    boom = {rid for rid, k in by_k.items() if k == 1}
    assert {entry["rollout_id"] for entry in failures} == boom
    assert all(entry["hook"] == "on_succeeded" and entry["log_level"] == "error" for entry in failures)


def test_a_missing_hooks_file_fails_at_start(gateway, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"agentlightning\.hooks"):
        _config(gateway, tmp_path / "nope.py")
