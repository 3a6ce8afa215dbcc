from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agentlightning.aggregation import (
    AggregationLevel,
    AggregationStats,
    Call,
    RowLimits,
    aggregate_calls,
    aggregate_rollout,
)
from agentlightning.rows import TrainingRow
from tests.trainer.scripts import Bad, Turn, call_event, render, scripts

TRAJ = AggregationLevel.TRAJECTORY
TRANS = AggregationLevel.TRANSITION
NO_LIMITS = RowLimits()


def _aggregate(events, level=TRAJ, limits=NO_LIMITS, reward=0.5):
    stats = AggregationStats()
    rows = aggregate_rollout(events, "r1", "g1", reward, level, limits, stats)
    for row in rows:
        row.check()
    return rows, stats


# --- trajectory ---------------------------------------------------------------------------


def test_two_turn_tool_call_merges_into_one_row_with_masked_context():
    events = [
        call_event([1, 2, 3], [10, 11], [-0.1, -0.2], 0),
        call_event([1, 2, 3, 10, 11, 20, 21, 22], [12], [-0.3], 1),
    ]
    rows, stats = _aggregate(events)
    assert len(rows) == 1
    row = rows[0]
    assert row.prompt_ids == [1, 2, 3]
    assert row.response_ids == [10, 11, 20, 21, 22, 12]
    assert row.response_mask == [1, 1, 0, 0, 0, 1]
    assert row.rollout_log_probs == [-0.1, -0.2, 0.0, 0.0, 0.0, -0.3]
    assert row.model_versions == [0, 0, -1, -1, -1, 1]
    assert (row.rollout_id, row.group_id, row.reward, row.n_calls, row.turn_index) == ("r1", "g1", 0.5, 2, 0)
    assert stats.n_merge_mismatch == 0 and stats.n_rows == 1 and stats.n_calls == 2


def test_prompt_that_rewrites_history_starts_a_new_row():
    events = [
        call_event([1, 2, 3], [10, 11], [-0.1, -0.2], 0),
        call_event([1, 2, 4, 10, 11, 20], [12], [-0.3], 0),  # token 3 became 4: a re-rendered history
    ]
    rows, stats = _aggregate(events)
    assert [r.prompt_ids for r in rows] == [[1, 2, 3], [1, 2, 4, 10, 11, 20]]
    assert [r.response_ids for r in rows] == [[10, 11], [12]]
    assert [r.turn_index for r in rows] == [0, 1]
    assert stats.n_merge_mismatch == 1 and stats.n_unmerged_rollouts == 1


def test_a_prompt_equal_to_the_conversation_merges_with_no_context():
    rows, _ = _aggregate([call_event([1], [2], [-1.0], 0), call_event([1, 2], [3], [-1.0], 0)])
    assert len(rows) == 1 and rows[0].response_ids == [2, 3] and rows[0].response_mask == [1, 1]


def test_log_probs_are_none_for_the_row_when_any_call_lacked_them():
    events = [call_event([1], [2], [-1.0], 0), call_event([1, 2, 5], [3], None, 0)]
    rows, stats = _aggregate(events)
    assert rows[0].rollout_log_probs is None
    assert stats.n_calls_no_log_probs == 1


def test_log_probs_of_the_wrong_length_count_as_missing():
    rows, stats = _aggregate([call_event([1], [2, 3], [-1.0], 0)])
    assert rows[0].rollout_log_probs is None and stats.n_calls_no_log_probs == 1


def test_failed_and_tokenless_calls_are_skipped_without_breaking_the_merge():
    events = [
        call_event([1, 2], [3], [-0.5], 0),
        call_event([1, 2, 3, 7], [9, 9], None, 0, status="error", error="upstream 500"),
        call_event([1, 2, 3, 7], [9], None, 0, http_status=502),
        call_event([1, 2, 3, 7], [], None, 0),
        call_event([], [4], None, 0),
        call_event([1, 2, 3, 7], [8], [-0.25], 0, http_status=200, status="ok"),
    ]
    rows, stats = _aggregate(events)
    assert len(rows) == 1
    assert rows[0].response_ids == [3, 7, 8] and rows[0].response_mask == [1, 0, 1]
    assert stats.n_calls_error == 2 and stats.n_calls_no_tokens == 2 and stats.n_calls == 2


def test_unknown_server_version_is_recorded_as_minus_one():
    rows, _ = _aggregate([call_event([1], [2, 3], [-1.0, -1.0], None)])
    assert rows[0].model_versions == [-1, -1]


def test_reward_events_and_other_event_types_are_ignored():
    events = [
        {"event_type": "reward", "data": {"value": 1.0}},
        {"event_type": "log", "data": {"prompt_token_ids": [1], "response_token_ids": [2]}},
        call_event([1], [2], [-1.0], 0),
    ]
    rows, stats = _aggregate(events)
    assert len(rows) == 1 and stats.n_calls == 1


def test_rollout_without_calls_makes_no_rows_and_is_counted():
    rows, stats = _aggregate([{"event_type": "reward", "data": {"value": 1.0}}])
    assert rows == [] and stats.n_rollouts_no_calls == 1


def test_malformed_call_data_is_counted_not_fatal():
    events = [
        {"event_type": "model_request", "data": None},
        {"event_type": "model_request", "data": {"prompt_token_ids": "x", "response_token_ids": [1]}},
        call_event([1], [2], [-1.0], 0),
    ]
    rows, stats = _aggregate(events)
    assert len(rows) == 1 and stats.n_calls_no_tokens == 2


# --- limits -------------------------------------------------------------------------------


def test_row_with_a_too_long_prompt_is_dropped_and_counted():
    events = [call_event([1, 2, 3, 4], [5], [-1.0], 0), call_event([9], [5], [-1.0], 0)]
    rows, stats = _aggregate(events, limits=RowLimits(max_prompt_length=3))
    assert [r.prompt_ids for r in rows] == [[9]]
    assert stats.n_dropped_prompt_too_long == 1 and stats.n_rows == 1


def test_response_past_the_limit_is_truncated_and_counted():
    events = [call_event([1], [2, 3], [-1.0, -2.0], 0), call_event([1, 2, 3, 4, 5], [6, 7], [-3.0, -4.0], 1)]
    rows, stats = _aggregate(events, limits=RowLimits(max_response_length=4))
    row = rows[0]
    assert row.response_ids == [2, 3, 4, 5] and row.response_mask == [1, 1, 0, 0]
    assert row.rollout_log_probs == [-1.0, -2.0, 0.0, 0.0] and row.model_versions == [0, 0, -1, -1]
    assert row.truncated and stats.n_truncated == 1


def test_row_left_without_trainable_tokens_is_skipped_and_counted():
    # Rows start with a response, so only a zero response limit (which the config refuses) can
    # leave one empty; the guard still holds for direct callers.
    stats = AggregationStats()
    rows = aggregate_calls(
        [Call([1], [2], None, 0)], "r", "g", 0.0, TRAJ, RowLimits(max_response_length=0), stats
    )
    assert rows == [] and stats.n_skipped_empty == 1 and stats.n_truncated == 1


# --- transition ---------------------------------------------------------------------------


def test_transition_makes_one_row_per_call():
    events = [
        call_event([1, 2], [3], [-0.5], 0),
        call_event([1, 2, 3, 4], [5, 6], [-0.1, -0.2], 1),
        call_event([1, 2, 3, 4], [5], None, 1, status="error"),
    ]
    rows, stats = _aggregate(events, level=TRANS)
    assert [(r.prompt_ids, r.response_ids, r.response_mask) for r in rows] == [
        ([1, 2], [3], [1]),
        ([1, 2, 3, 4], [5, 6], [1, 1]),
    ]
    assert [r.turn_index for r in rows] == [0, 1]
    assert [r.model_versions for r in rows] == [[0], [1, 1]]
    assert stats.n_rows == 2 and stats.n_merge_mismatch == 0


def test_transition_applies_the_limits_per_call():
    events = [call_event([1, 2, 3], [4], [-1.0], 0), call_event([1], [4, 5, 6], [-1.0] * 3, 0)]
    rows, stats = _aggregate(events, level=TRANS, limits=RowLimits(2, 2))
    assert [(r.prompt_ids, r.response_ids) for r in rows] == [([1], [4, 5])]
    assert stats.n_dropped_prompt_too_long == 1 and stats.n_truncated == 1


# --- properties ---------------------------------------------------------------------------


def _trainable(row: TrainingRow) -> list[int]:
    return [t for t, m in zip(row.response_ids, row.response_mask, strict=True) if m]


@settings(max_examples=300, deadline=None)
@given(scripts())
def test_trajectory_rows_match_the_script(script):
    first_prompt, steps = script
    events, expected = render(first_prompt, steps)
    rows, stats = _aggregate(events)
    assert len(rows) == len(expected)
    for row, exp in zip(rows, expected, strict=True):
        assert row.prompt_ids == exp.prompt
        assert row.response_ids == exp.response
        assert row.response_mask == exp.mask
        assert row.model_versions == exp.versions
        assert row.rollout_log_probs == exp.log_probs
        assert row.n_calls == len(exp.calls)
    assert stats.n_merge_mismatch == len(expected) - 1
    assert stats.n_calls == sum(isinstance(s, Turn) for s in steps)
    assert stats.n_calls_error + stats.n_calls_no_tokens == sum(isinstance(s, Bad) for s in steps)


@settings(max_examples=300, deadline=None)
@given(scripts())
def test_merged_rows_reconstruct_every_call_exactly(script):
    """Every call's prompt is a prefix of its row's sequence and its response follows it, all
    trainable; the trainable tokens are exactly the calls' responses, in order."""
    first_prompt, steps = script
    events, _ = render(first_prompt, steps)
    rows, _ = _aggregate(events)
    calls = [(e["data"]["prompt_token_ids"], e["data"]["response_token_ids"]) for e in events if _usable(e)]
    i = 0
    for row in rows:
        seq = row.prompt_ids + row.response_ids
        mask = [0] * len(row.prompt_ids) + row.response_mask
        covered_trainable: list[int] = []
        for _ in range(row.n_calls):
            prompt, response = calls[i]
            i += 1
            assert seq[: len(prompt)] == prompt
            end = len(prompt) + len(response)
            assert seq[len(prompt) : end] == response
            assert all(mask[len(prompt) : end])
            covered_trainable += response
        assert _trainable(row) == covered_trainable
        assert row.response_mask[0] == 1  # a row starts with a response
        if row.rollout_log_probs is not None:
            assert all(
                lp == 0.0 for lp, m in zip(row.rollout_log_probs, row.response_mask, strict=True) if not m
            )
        assert all(v == -1 for v, m in zip(row.model_versions, row.response_mask, strict=True) if not m)
    assert i == len(calls)


def _usable(event) -> bool:
    d = event["data"]
    return (
        bool(d["prompt_token_ids"])
        and bool(d["response_token_ids"])
        and "status" not in d
        and "http_status" not in d
    )


@settings(max_examples=300, deadline=None)
@given(scripts(), st.integers(1, 30), st.integers(1, 30))
def test_limits_drop_truncate_and_count(script, max_prompt, max_response):
    first_prompt, steps = script
    events, expected = render(first_prompt, steps)
    rows, stats = _aggregate(events, limits=RowLimits(max_prompt, max_response))
    kept = [e for e in expected if len(e.prompt) <= max_prompt]
    assert stats.n_dropped_prompt_too_long == len(expected) - len(kept)
    assert stats.n_truncated == sum(1 for e in kept if len(e.response) > max_response)
    assert len(rows) + stats.n_skipped_empty == len(kept)
    assert stats.n_skipped_empty == 0  # every row starts with a trainable token
    for row, exp in zip(rows, kept, strict=True):
        assert len(row.prompt_ids) <= max_prompt
        assert row.response_ids == exp.response[:max_response]
        assert row.response_mask == exp.mask[:max_response]
        assert row.truncated == (len(exp.response) > max_response)


@settings(max_examples=200, deadline=None)
@given(scripts())
def test_transition_rows_are_the_calls(script):
    first_prompt, steps = script
    events, _ = render(first_prompt, steps)
    rows, stats = _aggregate(events, level=TRANS)
    usable = [e["data"] for e in events if _usable(e)]
    assert [(r.prompt_ids, r.response_ids) for r in rows] == [
        (d["prompt_token_ids"], d["response_token_ids"]) for d in usable
    ]
    assert all(r.response_mask == [1] * len(r.response_ids) for r in rows)
    assert [r.rollout_log_probs for r in rows] == [d["response_log_probs"] for d in usable]
    assert stats.n_rows == len(usable)


# --- MoE routes (R3) --------------------------------------------------------------------------


def test_a_row_carries_its_last_calls_routes_and_a_mismatch_starts_over():
    events = [
        call_event([1, 2, 3], [10, 11], None, 0, routed_experts="first"),
        call_event([1, 2, 3, 10, 11, 20], [12], None, 1, routed_experts="second"),  # extends: merged
        call_event([7, 8], [9], None, 1),  # another conversation, no routes recorded
        call_event([7, 8, 9, 5], [6], None, 1, routed_experts="fourth"),
    ]
    rows, _ = _aggregate(events)
    assert [(r.n_calls, r.routed_experts) for r in rows] == [(2, "second"), (2, "fourth")]
    rows, _ = _aggregate(events, level=TRANS)
    assert [r.routed_experts for r in rows] == ["first", "second", None, "fourth"]
    # A merged call without routes leaves the row without: routes must cover the whole row.
    events[3]["data"].pop("routed_experts")
    rows, _ = _aggregate(events)
    assert [r.routed_experts for r in rows] == ["second", None]
