"""On-policy distillation (OPD) as an algorithm of the RL loop: a teacher scores the student's tokens.

The student samples in its own harness, through the Gateway, as in RL; the rows are the RL rows
(token-exact, the model's own tokens trainable). Before each update a teacher model gives the
log-prob of every sampled token of the row given the exact tokens before it — the prompt
log-probs of the student's own sequence, through the teacher engine's API: `POST
{teacher_url}/completions` with the token ids as the prompt and `prompt_logprobs: 0` (vLLM's
parameter; the built-in torch server, `agl-torch-server`, answers it too). Each trainable token
then gets its own advantage, the negative per-token reverse KL (its one-sample estimate on the
sampled token) plus, optionally, the task's:

    A_t = kl_coef · (log π_teacher(y_t | y_<t) − log π_student(y_t | y_<t)) + reward_coef · A_rollout

`log π_student` is the log-prob the Gateway recorded when the token was sampled (recomputed where
a call lacked it); `A_rollout` is the core's advantage (`algorithm.adv_estimator`) of the row's
rollout. Each row carries `A_t` in `token_advantages`; both backends' PPO losses take it per
token (the torch backend's `policy.py`, the verl backend's batch `advantages`).

This module is the backend-neutral part: the config, the teacher over HTTP, the tokenizer
check and the formula. A backend calls `open_teacher` at start-up and, before each update,
`distill(rows, teacher.score_rows(rows), student_log_probs, config)`, the student's log-probs
being the recorded ones or its own recomputation where a call lacked them.

Configured under verl's `algorithm` section (`algorithm.distill.*`). The teacher must share the
student's tokenizer — the scores are of the student's token ids — so its tokenizer is loaded and
compared at start-up, and a score for another token id than the one sent is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from agentlightning.config.schema import ConfigError
from agentlightning.rows import TrainingRow

KEY = "algorithm.distill"


class DistillError(RuntimeError):
    """The teacher could not score the student's tokens (its answer says why)."""


@dataclass
class DistillConfig:
    """`algorithm.distill.*`."""

    enable: bool = False
    teacher_url: str | None = None  # the teacher's OpenAI base URL (…/v1): agl-torch-server or vLLM
    teacher_model: str | None = None  # the model name it serves; None: the one it lists
    teacher_tokenizer: str | None = None  # where its tokenizer loads from (a model folder or a built-in name)
    kl_coef: float = 1.0  # weight of the per-token reverse-KL advantage
    reward_coef: float = (
        0.0  # weight of the task's advantage (algorithm.adv_estimator's); 0: pure distillation
    )
    timeout_seconds: float = 120.0
    concurrency: int = 8  # scoring requests in flight

    def validate(self) -> None:
        if not self.enable:
            return
        if not self.teacher_url:
            raise ConfigError(f"{KEY}.enable needs {KEY}.teacher_url (the teacher's OpenAI base URL, …/v1)")
        if not self.teacher_tokenizer:
            raise ConfigError(
                f"{KEY}.enable needs {KEY}.teacher_tokenizer (the teacher's model folder or tokenizer): the "
                "teacher must share the student's tokenizer, and it is checked before training"
            )
        if self.kl_coef < 0 or self.reward_coef < 0 or self.kl_coef + self.reward_coef == 0:
            raise ConfigError(f"{KEY}.kl_coef and reward_coef must be >= 0, not both 0")
        if self.timeout_seconds <= 0 or self.concurrency < 1:
            raise ConfigError(f"{KEY}.timeout_seconds must be > 0 and concurrency >= 1")


# --- the signal -------------------------------------------------------------------------------


def token_advantages(
    student: Sequence[float],
    teacher: Sequence[float],
    mask: Sequence[int],
    kl_coef: float = 1.0,
    rollout_advantage: float = 0.0,
    reward_coef: float = 0.0,
) -> list[float]:
    """Per response token: `kl_coef · (teacher − student) + reward_coef · rollout_advantage` on a
    trainable token (the negative reverse-KL estimate, plus the task's), 0 on context."""
    if not len(student) == len(teacher) == len(mask):
        raise ValueError(f"{len(student)} student, {len(teacher)} teacher log-probs for {len(mask)} tokens")
    return [
        kl_coef * (t - s) + reward_coef * rollout_advantage if m else 0.0
        for s, t, m in zip(student, teacher, mask, strict=True)
    ]


def reverse_kl(student: Sequence[float], teacher: Sequence[float], mask: Sequence[int]) -> float:
    """The mean per-token reverse KL estimate `log π_student − log π_teacher` on trainable tokens."""
    values = [s - t for s, t, m in zip(student, teacher, mask, strict=True) if m]
    return sum(values) / len(values) if values else 0.0


# --- the tokenizer check ----------------------------------------------------------------------


def check_same_tokenizer(student: Any, teacher: Any) -> None:
    """ConfigError unless both tokenizers map the same strings to the same ids (the teacher scores
    the student's ids: another vocabulary would score other tokens)."""
    s_vocab, t_vocab = student.get_vocab(), teacher.get_vocab()
    if s_vocab == t_vocab:
        return
    only_s = sorted(set(s_vocab) - set(t_vocab))
    moved = sorted(k for k in set(s_vocab) & set(t_vocab) if s_vocab[k] != t_vocab[k])
    detail = (
        f"{len(s_vocab)} vs {len(t_vocab)} tokens"
        + (f"; e.g. {only_s[0]!r} is only the student's" if only_s else "")
        + (f"; e.g. {moved[0]!r} is id {s_vocab[moved[0]]} vs {t_vocab[moved[0]]}" if moved else "")
    )
    raise ConfigError(
        f"{KEY}.teacher_tokenizer: the teacher's vocabulary differs from the student's ({detail}). "
        "On-policy distillation scores the student's token ids with the teacher: use a teacher of the "
        "same tokenizer (same model family)"
    )


# --- the teacher ------------------------------------------------------------------------------


def parse_prompt_logprobs(entries: Any, sequence: Sequence[int]) -> list[float]:
    """The log-prob of each token after the first from a vLLM-shaped `prompt_logprobs` list
    (`[None, {"id": {"logprob": ...}}, ...]`), checked to be of the ids sent."""
    if not isinstance(entries, list) or len(entries) != len(sequence):
        n = len(entries) if isinstance(entries, list) else entries
        raise DistillError(f"the teacher returned {n} prompt log-probs for {len(sequence)} tokens")
    out: list[float] = []
    for i in range(1, len(sequence)):
        entry = entries[i]
        item = entry.get(str(sequence[i])) if isinstance(entry, dict) else None
        if not isinstance(item, dict) or not isinstance(item.get("logprob"), int | float):
            got = sorted(entry) if isinstance(entry, dict) else entry
            raise DistillError(
                f"the teacher scored tokens {got} at position {i} where the student's sequence has "
                f"{sequence[i]}: it tokenizes differently"
            )
        out.append(float(item["logprob"]))
    return out


class Teacher:
    """A teacher endpoint's prompt log-probs of token sequences."""

    def __init__(self, config: DistillConfig, client: httpx.Client | None = None) -> None:
        assert config.teacher_url is not None
        self.config = config
        self.url = config.teacher_url.rstrip("/")
        self.http = client or httpx.Client(timeout=config.timeout_seconds, trust_env=False)
        self.model = config.teacher_model or self._only_model()

    def _only_model(self) -> str:
        try:
            answer = self.http.get(f"{self.url}/models")
            answer.raise_for_status()
            names = [m["id"] for m in answer.json()["data"]]
        except (httpx.HTTPError, KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{KEY}.teacher_url: GET {self.url}/models failed: {exc}") from None
        if len(names) != 1:
            raise ConfigError(f"{KEY}.teacher_model: the teacher serves {names}; name one")
        return str(names[0])

    def score(self, sequence: Sequence[int]) -> list[float]:
        body = {
            "model": self.model,
            "prompt": list(sequence),
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": 0,
        }
        try:
            answer = self.http.post(f"{self.url}/completions", json=body)
        except httpx.HTTPError as exc:
            raise DistillError(f"the teacher at {self.url} did not answer: {exc}") from None
        if answer.status_code != 200:
            raise DistillError(
                f"the teacher at {self.url} answered {answer.status_code}: {answer.text[:300]}"
            )
        choices = answer.json().get("choices") or [{}]
        return parse_prompt_logprobs(choices[0].get("prompt_logprobs"), sequence)

    def score_rows(self, rows: Sequence[TrainingRow]) -> list[list[float]]:
        """Per row, the teacher's log-prob of each response token."""

        def one(row: TrainingRow) -> list[float]:
            scores = self.score(row.prompt_ids + row.response_ids)
            return scores[len(row.prompt_ids) - 1 :]

        with ThreadPoolExecutor(self.config.concurrency) as pool:
            return list(pool.map(one, rows))

    def close(self) -> None:
        self.http.close()


def open_teacher(
    config: DistillConfig, student_tokenizer: Any, load_tokenizer: Callable[[str], Any]
) -> Teacher:
    """The teacher of a validated, enabled `config`, once its tokenizer (loaded by the backend's
    `load_tokenizer`) is checked to be the student's; ConfigError naming the key otherwise."""
    assert config.enable and config.teacher_tokenizer is not None  # validate() checked it
    try:
        teacher_tokenizer = load_tokenizer(config.teacher_tokenizer)
    except OSError as exc:
        raise ConfigError(
            f"{KEY}.teacher_tokenizer: cannot load {config.teacher_tokenizer!r}: {exc}"
        ) from None
    check_same_tokenizer(student_tokenizer, teacher_tokenizer)
    return Teacher(config)


def distill(
    rows: Sequence[TrainingRow],
    teacher_lps: Sequence[Sequence[float]],
    student_lps: Sequence[Sequence[float]],
    config: DistillConfig,
) -> dict[str, float]:
    """Set each row's `token_advantages`; returns the batch's distillation metrics."""
    kls: list[float] = []
    weights: list[int] = []
    for row, t_lp, s_lp in zip(rows, teacher_lps, student_lps, strict=True):
        row.token_advantages = token_advantages(
            s_lp, t_lp, row.response_mask, config.kl_coef, row.advantage, config.reward_coef
        )
        kls.append(reverse_kl(s_lp, t_lp, row.response_mask))
        weights.append(row.n_trainable)
    total = sum(weights)
    return {
        "distill/reverse_kl": sum(k * w for k, w in zip(kls, weights, strict=True)) / total if total else 0.0,
        "distill/rows": float(len(rows)),
    }
