"""The proxy's memory of an attempt's calls: which earlier call a history repeats (by meaning),
the prompt that continues it token for token, and why a prompt does not."""

from __future__ import annotations

from typing import Any

from agentlightning.server.proxy.history import (
    AttemptHistory,
    Turn,
    answered,
    classify,
    continuation,
    knows,
    meaning,
    prompt_and_segment,
)

USER = {"role": "user", "content": "what is 7+5"}
SYSTEM = {"role": "system", "content": "you calculate"}
CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"a":1,"b":2}'}}
    ],
}
# The same call as a harness sends it back: other id, spacing, key order, empty text.
CALL_RESENT = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        {"id": "x9", "type": "function", "function": {"name": "calc", "arguments": '{"b": 2, "a": 1}'}}
    ],
}
RESULT = {"role": "tool", "tool_call_id": "c1", "content": "12"}
EOS = 2


def turn(
    messages: list[dict[str, Any]], rendered: list[int], response: list[int], finished: bool = True
) -> Turn:
    return Turn(
        messages=[meaning(m) for m in messages],
        tools="[]",
        rendered=rendered,
        prompt=list(rendered),
        response=response,
        answer=meaning(CALL),
        finished=finished,
    )


def test_meaning_ignores_ids_spacing_key_order_and_surrounding_whitespace() -> None:
    assert meaning(CALL) == meaning(CALL_RESENT)
    assert meaning({"role": "user", "content": " hi\n"}) == meaning(
        {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    )
    assert meaning(CALL) != meaning({**CALL_RESENT, "content": "and some text"})


def test_a_history_that_repeats_a_call_continues_its_exact_tokens() -> None:
    # The model wrote [50, 51, EOS]; the template re-renders that answer as [60, 61, 62, EOS].
    first = turn([SYSTEM, USER], rendered=[1, 10, 11, 5], response=[50, 51, EOS])
    rendered = [1, 10, 11, 5, 60, 61, 62, EOS, 9, 6, 70, EOS, 9, 5]
    messages = [meaning(m) for m in (SYSTEM, USER, CALL_RESENT, RESULT)]
    assert continuation([first], messages, rendered) == [1, 10, 11, 5, 50, 51, EOS, 9, 6, 70, EOS, 9, 5]

    # No continuation when the answer was edited, cut off, or the earlier request differs.
    edited = [*messages[:2], meaning({**CALL, "content": "other"}), messages[3]]
    assert continuation([first], edited, rendered) is None
    assert (
        continuation([turn([SYSTEM, USER], [1, 10, 11, 5], [50, 51], finished=False)], messages, rendered)
        is None
    )
    assert continuation([first], messages, [1, 10, 12, 5, 60, EOS, 9, 5]) is None


def test_classify_names_the_reason_and_the_token_where_the_prompt_stops_continuing() -> None:
    first = turn([SYSTEM, USER], rendered=[1, 10, 11, 5], response=[50, 51, EOS])
    assert classify([], [], "[]", [1, 2]) is None  # the attempt's first call
    assert classify([first], [], "[]", [1, 10, 11, 5, 50, 51, EOS, 9]) is None  # it continues
    messages = [meaning(m) for m in (SYSTEM, USER, CALL_RESENT, RESULT)]
    assert classify([first], messages, "[]", [1, 10, 11, 5, 60, 61, EOS]) == {
        "reason": "rerendered",
        "index": 4,
    }
    assert classify([first], messages, '[{"x": 1}]', [1, 2]) == {"reason": "tools_changed", "index": 1}
    other_system = [meaning({"role": "system", "content": "new"}), *messages[1:]]
    assert classify([first], other_system, "[]", [1, 3])["reason"] == "system_changed"  # type: ignore[index]
    summary = [meaning(SYSTEM), meaning({"role": "user", "content": "summary"})]
    assert classify([first], summary, "[]", [1, 10, 30])["reason"] == "history_shortened"  # type: ignore[index]
    edited_answer = [*messages[:2], meaning({**CALL, "content": "x"}), messages[3]]
    assert classify([first], edited_answer, "[]", [1, 10, 11, 5, 7])["reason"] == "answer_edited"  # type: ignore[index]


def test_a_call_that_goes_on_from_before_the_latest_answer_keeps_its_tokens_and_records_the_break() -> None:
    """A branch: the agent dropped the latest answer (or changed it past repeating) and went on
    from the turn before. The earlier turn's exact tokens are continued, and the break from the
    latest turn is recorded: the rollout's row breaks there."""
    first = turn([SYSTEM, USER], rendered=[1, 10, 11, 5], response=[50, 51, EOS])
    messages = [meaning(m) for m in (SYSTEM, USER, CALL_RESENT, RESULT)]
    # The latest turn continued the first: its prompt is not a rendering.
    continued = [1, 10, 11, 5, 50, 51, EOS, 9, 6, 70, EOS, 9, 5]
    latest = Turn(messages, "[]", None, continued, [80, 81, EOS], meaning(CALL), finished=True)
    rendered = [1, 10, 11, 5, 60, 61, 62, EOS, 9, 6, 70, EOS, 9, 5]
    # The latest answer sent back edited, then a new tool result.
    went_on = [*messages, meaning({**CALL, "content": "edited"}), meaning(RESULT)]
    rendered_on = [*rendered, 82, EOS, 9, 6, 71, EOS, 9, 5]
    prompt, segment = prompt_and_segment([first, latest], went_on, "[]", rendered_on)
    assert prompt == [1, 10, 11, 5, 50, 51, EOS, *rendered_on[8:]]  # the first turn's exact tokens
    assert segment == {
        "continues": True,
        "token_exact": True,
        "break": {"reason": "answer_edited", "index": 13},
    }
    # Going on from the latest answer: no break; the attempt's first call: first.
    assert prompt_and_segment([first], messages, "[]", rendered)[1] == {
        "continues": True,
        "token_exact": True,
    }
    assert prompt_and_segment([], messages, "[]", rendered) == (
        rendered,
        {"continues": False, "token_exact": True, "first": True},
    )


def test_history_keeps_a_token_budget() -> None:
    history = AttemptHistory(max_tokens=100)
    for i in range(10):
        history.add(f"r{i}", "a", turn([USER], rendered=list(range(20)), response=[1, 2, EOS]))
    assert history.tokens <= 100
    assert history.turns("r9", "a") and not history.turns("r0", "a")


def test_a_deleted_rollouts_turns_are_forgotten() -> None:
    history = AttemptHistory()
    for rid, aid in (("r1", "a"), ("r1", "b"), ("r2", "a")):
        history.add(rid, aid, turn([USER], rendered=list(range(20)), response=[1, 2, EOS]))
    history.forget("r1")  # a rollout created again as r1 must not continue the deleted one's tokens
    assert not history.turns("r1", "a") and not history.turns("r1", "b")
    assert history.turns("r2", "a") and history.tokens == 43
    history.forget("r1")
    history.forget("r2")
    assert history.tokens == 0


def test_a_request_repeating_an_answer_this_gateway_did_not_record_is_not_known() -> None:
    """`knows` decides when the attempt's calls are read back from the store (another replica
    served the call, a restart): only when the request's last assistant message is no turn's."""
    first = turn([SYSTEM, USER], rendered=[1, 10, 11, 5], response=[50, 51, EOS])
    after_first = [meaning(m) for m in (SYSTEM, USER, CALL_RESENT, RESULT)]
    assert knows([], [meaning(SYSTEM), meaning(USER)])  # repeats no answer
    assert knows([first], after_first) and answered([first], after_first) is first
    assert not knows([], after_first)  # e.g. the first call was served by another replica
    # A second call this Gateway did not serve: its answer is repeated, the first call's is not the last.
    second_answer = {"role": "assistant", "content": "it is 12"}
    after_second = [*after_first, meaning(second_answer), meaning({"role": "user", "content": "and 8+1?"})]
    assert not knows([first], after_second)
    # Two conversations in one attempt (e.g. a planner and a writer): each repeats its own turn.
    other = turn([USER], rendered=[1, 11, 5], response=[52, EOS])
    assert knows([first, other], after_first) and answered([first, other], after_first) is first
    # An edited answer is no turn's: read back, still not found, the call starts a new segment.
    edited = [meaning(m) for m in (SYSTEM, USER, {"role": "assistant", "content": "edited"}, RESULT)]
    assert not knows([first], edited)


def test_turns_read_back_replace_the_attempts_and_keep_the_budget() -> None:
    history = AttemptHistory()
    history.add("r1", "a", turn([USER], rendered=list(range(20)), response=[1, 2, EOS]))
    read_back = [turn([USER], rendered=list(range(20)), response=[1, 2, EOS]) for _ in range(3)]
    read_back[2].rendered = None  # a continued call: its rendering is not stored
    history.replace("r1", "a", read_back)
    assert (
        history.turns("r1", "a") == read_back and history.tokens == 43 + 43 + 23
    )  # rendered and prompt, prompt alone
    # A turn without its rendering is never continued (token_exact.py renders it again first).
    messages = [meaning(USER), meaning(CALL), meaning(RESULT)]
    assert continuation([read_back[2]], messages, [*range(20), 60, EOS, 7]) is None
    history.forget("r1")
    assert history.tokens == 0
