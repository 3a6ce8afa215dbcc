"""Search-R1: a multi-turn agent on the plain `openai` client that searches a retrieval service.

Each turn the model either searches (`<search> query </search>`: the agent asks the retrieval
service and answers with `<information>…</information>` as the next user turn) or answers
(`<answer> … </answer>`: the episode ends); anything else gets v1.0's "invalid action" nudge.
After `SEARCH_R1_MAX_TURNS` turns without an answer the model gets one last turn, as in v1.0.
The reward is exact match after normalisation (lower case, no punctuation or articles) of the
last `<answer>` of the model's last turn against any of the golden answers.

Environment (set by the Controller): `AGL_OPENAI_BASE_URL`, `AGL_EVENT_URL`, `AGL_KEY`, `QUESTION`,
`GOLDEN_ANSWERS` (a JSON list, or one answer as a string) — env_map `QUESTION: input.question`,
`GOLDEN_ANSWERS: input.golden_answers`. Knobs (inherited from the Controller's environment):

| variable | default | |
|---|---|---|
| `SEARCH_R1_RETRIEVAL_URL` | `http://127.0.0.1:8000/retrieve` | the retrieval service |
| `SEARCH_R1_MAX_TURNS` | 4 | model turns before the last one |
| `SEARCH_R1_TOPK` | 3 | documents per search |
| `SEARCH_R1_MAX_TOKENS` | 500 | `max_tokens` of each model call |
| `SEARCH_R1_RETRIEVAL_WAIT` | 120 | seconds to keep retrying an unreachable (restarting) service |
"""

from __future__ import annotations

import json
import logging
import os
import re
import string
import sys
import time

import httpx
from openai import BadRequestError, OpenAI
from openai.types.chat import ChatCompletionMessageParam

from agentlightning.agent_events import post_reward

log = logging.getLogger("search_r1.agent")

# Search-R1's instruction (v1.0's INSTRUCTION_FORMAT, from Search-R1's nq_search.py).
INSTRUCTION = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time "
    "you get new information. After reasoning, if you find you lack some knowledge, you can call a search "
    "engine by <search> query </search> and it will return the top searched results between <information> "
    "and </information>. You can search as many times as your want. If you find no further external "
    "knowledge needed, you can directly provide the answer inside <answer> and </answer>, without detailed "
    "illustrations. For example, <answer> Beijing </answer>. Question: "
)
INVALID = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
    "</search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)
_ACTION = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def setting(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise SystemExit(f"{name}={raw!r}: expected a number") from None


# --- reward: exact match after normalisation (Search-R1's qa_em) ----------------------------------


def normalize_answer(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def extract_answer(reply: str | None) -> str | None:
    """The last `<answer>…</answer>` of the model's reply. (v1.0 applies Search-R1's scorer, which
    wants two matches because it reads prompt + reply, to the reply alone: one answer scored 0.)"""
    found = _ANSWER.findall(reply or "")
    return found[-1].strip() if found else None


def exact_match(reply: str | None, golden: list[str]) -> float:
    answer = extract_answer(reply)
    if answer is None:
        return 0.0
    return 1.0 if normalize_answer(answer) in {normalize_answer(g) for g in golden} else 0.0


def golden_answers(raw: str) -> list[str]:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return [raw]
    if isinstance(value, list):
        return [str(v) for v in value]
    return [str(value)]


# --- the retrieval service ------------------------------------------------------------------------


class Retrieval:
    """POST /retrieve with retries: a service that is down or restarting (connection refused, 5xx)
    is retried with backoff for up to `wait` seconds; a 4xx (a bad query) is shown to the model."""

    def __init__(self, url: str, topk: int, wait: float) -> None:
        self.url, self.topk, self.wait = url, topk, wait
        self.http = httpx.Client(timeout=30.0, trust_env=False)
        self.calls = 0
        self.retries = 0

    def search(self, query: str) -> str:
        self.calls += 1
        deadline = time.monotonic() + self.wait
        delay = 0.25
        while True:
            try:
                response = self.http.post(
                    self.url, json={"queries": [query], "topk": self.topk, "return_scores": True}
                )
                if response.status_code < 500:
                    break
                problem = f"HTTP {response.status_code}"
            except httpx.TransportError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            if time.monotonic() + delay > deadline:
                raise RuntimeError(f"the retrieval service at {self.url} is unavailable: {problem}")
            self.retries += 1
            log.warning("retrieval unavailable (%s); retry %d in %.2f s", problem, self.retries, delay)
            time.sleep(delay)
            delay = min(delay * 2, 4.0)
        if response.status_code >= 400:
            return f"search error: {response.text[:300]}"
        hits = response.json()["result"][0]
        return "".join(
            f"Doc {n}(Title: {hit['document']['title']}) {hit['document']['text']}\n"
            for n, hit in enumerate(hits, 1)
        )

    def close(self) -> None:
        self.http.close()


# --- the episode ----------------------------------------------------------------------------------


def run_episode(
    client: OpenAI, retrieval: Retrieval, question: str, max_turns: int, max_tokens: int
) -> tuple[str | None, int]:
    """(the model's last reply, model calls made)."""
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": INSTRUCTION + question}]
    calls = 0
    reply: str | None = None
    for turn in range(max_turns + 1):  # the extra turn is v1.0's last try without an answer
        try:
            response = client.chat.completions.create(
                model="policy", messages=messages, max_tokens=max_tokens
            )
        except BadRequestError as exc:  # e.g. the conversation outgrew the model's context
            log.warning("model call %d refused: %s", calls + 1, exc)
            return reply, calls
        calls += 1
        reply = response.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": reply})
        match = _ACTION.search(reply)
        if match and match.group(1) == "answer":
            return reply, calls
        if turn == max_turns:
            break
        if match:
            feedback = f"\n\n<information>{retrieval.search(match.group(2).strip())}</information>\n\n"
        else:
            feedback = INVALID
        messages.append({"role": "user", "content": feedback})
    return reply, calls


class SearchR1Agent:
    """The rollout entry point (`agent_class: search_r1_agent:SearchR1Agent`)."""

    def run(self) -> float:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
        logging.getLogger("httpx").setLevel(logging.WARNING)
        retrieval = Retrieval(
            os.environ.get("SEARCH_R1_RETRIEVAL_URL", "http://127.0.0.1:8000/retrieve"),
            int(setting("SEARCH_R1_TOPK", 3)),
            setting("SEARCH_R1_RETRIEVAL_WAIT", 120.0),
        )
        client = OpenAI(
            base_url=os.environ["AGL_OPENAI_BASE_URL"],
            api_key=os.environ.get("AGL_KEY") or "unused",
            max_retries=6,
            timeout=300.0,
        )
        golden = golden_answers(os.environ["GOLDEN_ANSWERS"])
        try:
            reply, calls = run_episode(
                client,
                retrieval,
                os.environ["QUESTION"],
                int(setting("SEARCH_R1_MAX_TURNS", 4)),
                int(setting("SEARCH_R1_MAX_TOKENS", 500)),
            )
        finally:
            client.close()
            retrieval.close()
        value = exact_match(reply, golden)
        log.info(
            "episode model_calls=%d searches=%d retrieval_retries=%d answer=%r golden=%r reward=%s",
            calls,
            retrieval.calls,
            retrieval.retries,
            extract_answer(reply),
            golden,
            value,
        )
        reason = f"answer={extract_answer(reply)!r} golden={golden!r}"
        post_reward(value, source="search_r1", reason=reason[:500])
        return value


if __name__ == "__main__":
    SearchR1Agent().run()
