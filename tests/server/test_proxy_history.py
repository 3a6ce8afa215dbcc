"""The proxy's memory of an attempt's calls: which earlier call a history repeats (by meaning),
the prompt that continues it token for token, and why a prompt does not."""

from __future__ import annotations

from typing import Any

from agentlightning.server.proxy.history import AttemptHistory, Turn, classify, continuation, meaning

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
