"""From the findings to a verdict, with what to change; and the report, as Markdown or JSON.

    trainable                -> exit 0
    trainable with breaks    -> exit 1 (a rollout makes more than one row: where and why)
    not trainable            -> exit 3 (nothing or the wrong thing would be trained: why)

Exit 2 is bad input or a run that could not be made (`cli.py`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from agentlightning.doctor.analysis import PASS_THROUGH, TOKEN_PATH, Break, PathReport
from agentlightning.doctor.probes import Probe

TRAINABLE = "trainable"
WITH_BREAKS = "trainable with breaks"
NOT_TRAINABLE = "not trainable"
EXIT_CODES = {TRAINABLE: 0, WITH_BREAKS: 1, NOT_TRAINABLE: 3}
EXIT_BAD_INPUT = 2

FATAL, BREAK, WARNING = "fatal", "break", "warning"

# What each of the Gateway's segment-break reasons means for a harness, and what to change.
BREAK_FIXES: dict[str, str] = {
    "tools_changed": "the harness sends other `tools` from one call to the next (e.g. none on its last "
    "call): send the same tools on every call of a rollout",
    "system_changed": "the system prompt changes during a rollout (a date, a counter, a step note): "
    "keep it fixed and put what changes in a user turn",
    "history_shortened": "the harness drops or compacts earlier turns (compaction, a context window "
    "trimmer): raise its threshold or turn it off; each part trains as its own row",
    "history_edited": "the harness rewrites earlier turns (a summary, a redaction, re-ordered "
    "messages): send the history as it was",
    "answer_edited": "the harness sends the model's answer back changed (reasoning stripped, tool calls "
    "re-formatted, text trimmed): send it back as the API returned it",
    "answer_unfinished": "an answer was cut by max_tokens and the harness went on: raise its max_tokens",
    "rerendered": "the chat template renders the model's own turns differently from how it wrote them "
    "(tool-call JSON layout, whitespace): serve the model with vLLM's token endpoints "
    "(`vllm serve --enable-scale-out`, the Gateway's `default_proxy.token_exact: true`)",
    "history_changed": "the conversation changed between calls: send each call the whole history as it was",
}


@dataclass
class Finding:
    severity: str  # FATAL | BREAK | WARNING
    what: str
    fix: str = ""


@dataclass
class HarnessReport:
    harness: str
    server: str
    paths: list[PathReport]
    probes: list[Probe]
    findings: list[Finding] = field(default_factory=list)
    verdict: str = TRAINABLE
    notes: list[str] = field(default_factory=list)  # what was not checked, and why

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    def path(self, name: str) -> PathReport | None:
        return next((p for p in self.paths if p.path == name), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "harness": self.harness,
            "server": self.server,
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "findings": [f.__dict__ for f in self.findings],
            "paths": [p.to_json() for p in self.paths],
            "probes": [p.to_json() for p in self.probes],
            "notes": self.notes,
        }


def _where(breaks: list[Break], limit: int = 3) -> str:
    shown = [f"call {b.call} of {b.rollout_id} at token {b.index}" for b in breaks[:limit]]
    more = f" and {len(breaks) - limit} more" if len(breaks) > limit else ""
    return ", ".join(shown) + more


def judge(report: HarnessReport) -> HarnessReport:
    """Fill `findings` and `verdict` from the paths and probes."""
    out: list[Finding] = []
    token, passed = report.path(TOKEN_PATH), report.path(PASS_THROUGH)
    # The path training would take: the token path where the server serves it (the run names a
    # token path only when it does).
    served_exact = token is not None
    main = token if token is not None else passed
    assert main is not None, "the doctor runs at least one path"
    if token is not None and token.token_exact_calls < token.total_calls:
        out.append(
            Finding(
                WARNING,
                f"{token.total_calls - token.token_exact_calls} of {token.total_calls} calls were passed through "
                "on the token path (the completions API, or a call the token path could not serve)",
                "those calls are trained as the server re-renders them: use the chat, Responses or Messages API",
            )
        )
    if main.succeeded == 0:
        first = main.failures[0] if main.failures else "no rollout ran"
        out.append(
            Finding(
                FATAL,
                f"every rollout failed ({first})",
                "fix the agent: the last line of its log is above; `--work DIR` keeps the whole log "
                "(DIR/<path>/agents/)",
            )
        )
    elif main.failures:
        out.append(
            Finding(
                WARNING,
                f"{len(main.failures)} of {main.rollouts} rollouts failed: {_failure_kinds(main.failures)}",
                "failed rollouts are not trained on",
            )
        )
    if main.succeeded and main.total_calls == 0:
        out.append(
            Finding(
                FATAL,
                "no model call reached the Gateway: the harness calls the model some other way",
                "point the harness's client at the rollout's URL: AGL_OPENAI_BASE_URL (or OPENAI_BASE_URL), "
                "AGL_ANTHROPIC_BASE_URL for the Messages API, with AGL_KEY as the API key",
            )
        )
    elif main.total_calls and main.calls_without_tokens == main.total_calls - main.calls_failed:
        out.append(
            Finding(
                FATAL,
                "no recorded call has prompt and answer token ids",
                "serve the model with vLLM >= 0.10.2 (return_token_ids) or the built-in engine",
            )
        )
    if main.calls_failed:
        out.append(
            Finding(
                WARNING,
                f"{main.calls_failed} of {main.total_calls} model calls answered an error",
                "see the Gateway log",
            )
        )
    if main.succeeded and main.rollouts_without_reward:
        if not main.rewards:
            out.append(
                Finding(
                    FATAL,
                    "no rollout reported a reward",
                    "post a `reward` event to AGL_EVENT_URL (with AGL_KEY) at the end of each rollout",
                )
            )
        else:
            out.append(
                Finding(
                    WARNING,
                    f"{main.rollouts_without_reward} succeeded rollouts reported no reward (trained as 0)",
                    "report a reward on every path through the harness",
                )
            )
    by_reason: dict[str, list[Break]] = {}
    for b in main.breaks:
        by_reason.setdefault(b.reason, []).append(b)
    for reason, breaks in by_reason.items():
        out.append(
            Finding(
                BREAK,
                f"{len(breaks)} segment break(s), reason `{reason}` ({main.path}): {_where(breaks)}",
                BREAK_FIXES.get(reason, BREAK_FIXES["history_changed"]),
            )
        )
    if served_exact and passed is not None and passed.breaks and not main.breaks:
        reasons = ", ".join(f"`{r}`" for r in sorted({b.reason for b in passed.breaks}))
        out.append(
            Finding(
                WARNING,
                f"on pass-through the rollouts break ({reasons}: {_where(passed.breaks, 2)}); the token path keeps "
                "each one row",
                "keep `default_proxy.token_exact: true` and a server with vLLM's token endpoints",
            )
        )
    out += _probe_findings(report.probes, main, served_exact)
    report.findings = out
    severities = {f.severity for f in out}
    report.verdict = (
        NOT_TRAINABLE if FATAL in severities else WITH_BREAKS if BREAK in severities else TRAINABLE
    )
    return report


def _failure_kinds(failures: list[str]) -> str:
    kinds = Counter(f.split(": ", 1)[-1].split(":", 1)[0][:80] for f in failures)
    return "; ".join(f"{n}× {kind}" for kind, n in kinds.most_common(3))


def _probe_findings(probes: list[Probe], main: PathReport, served_exact: bool) -> list[Finding]:
    out: list[Finding] = []
    regen = [p for p in probes if p.check == "regenerate" and p.ok is False]
    if regen:
        out.append(
            Finding(
                FATAL,
                f"greedy re-generation from {len(regen)} recorded prompt(s) does not give the recorded answer "
                f"(first at answer token {regen[0].first_difference} of call {regen[0].call} of {regen[0].rollout_id})",
                "the recorded ids are not what the model generates from them: check the server's tokenizer "
                "round trip (detokenized then re-tokenized answers) and that it returns the ids it sampled",
            )
        )
    render = [p for p in probes if p.check == "render" and p.ok is False]
    if render:
        first = render[0]
        text = (
            f"{len(render)} recorded prompt(s) differ from the server's own render of the request "
            f"(first: call {first.call} of {first.rollout_id} at token {first.first_difference})"
        )
        if served_exact:
            out.append(
                Finding(
                    WARNING,
                    text + ": the token path kept what the model wrote, where a re-render would not",
                    "nothing while training on the token path; on pass-through these calls would break",
                )
            )
        else:
            out.append(
                Finding(FATAL, text, "the server's chat template must render requests the same way each time")
            )
    stream = [p for p in probes if p.check == "stream" and p.ok is False]
    if stream:
        streams = "streaming" in main.features
        text = f"a streamed answer differs from the same request not streamed ({stream[0].note})"
        fix = (
            "the server's streamed answer (its streaming tool-call parser) gives other ids or tool calls: "
            "turn streaming off in the harness, or fix the server's streaming parser"
        )
        out.append(Finding(FATAL if streams and not served_exact else WARNING, text, fix))
    return out


# --- the report on screen ---------------------------------------------------------------------


def markdown(report: HarnessReport) -> str:
    lines = [f"## {report.harness}: **{report.verdict}**", "", f"Model server: {report.server}", ""]
    lines += [
        "| | " + " | ".join(p.path for p in report.paths) + " |",
        "|---|" + "---|" * len(report.paths),
    ]
    rows: list[tuple[str, Any]] = [
        ("rollouts (succeeded / run)", lambda p: f"{p.succeeded} / {p.rollouts}"),
        ("APIs", lambda p: ", ".join(f"{a} ({n})" for a, n in p.apis.items()) or "—"),
        ("features", lambda p: ", ".join(p.features) or "—"),
        ("calls / rollout", lambda p: p.calls_per_rollout),
        ("prompt tokens / call", lambda p: p.prompt_tokens),
        ("answer tokens / call", lambda p: p.response_tokens),
        ("served on token ids", lambda p: f"{p.token_exact_calls} / {p.total_calls} calls"),
        ("rows / rollout", lambda p: p.rows_per_rollout),
        (
            "segment breaks",
            lambda p: "; ".join(f"call {b.call}: {b.reason} @ {b.index}" for b in p.breaks) or "none",
        ),
        ("rewards", rewards_cell),
    ]
    for label, cell in rows:
        lines.append(f"| {label} | " + " | ".join(_cell(cell(p)) for p in report.paths) + " |")
    lines.append("")
    for check in ("render", "regenerate", "stream"):
        done = [p for p in report.probes if p.check == check]
        if not done:
            continue
        asked = [p for p in done if p.ok is not None]
        equal = sum(bool(p.ok) for p in asked)
        skipped = (
            f"; {len(done) - len(asked)} not checked ({done[0].note or next(p.note for p in done if p.note)})"
            if len(asked) < len(done)
            else ""
        )
        lines.append(f"- {_CHECKS[check]}: {equal} of {len(asked)} equal{skipped}")
    for note in report.notes:
        lines.append(f"- note: {note}")
    lines.append("")
    if report.findings:
        lines.append("What to change:")
        lines.append("")
        for f in report.findings:
            lines.append(f"- **{f.severity}**: {f.what}" + (f". Fix: {f.fix}" if f.fix else ""))
    else:
        lines.append("Nothing to change: every rollout is one row, with a reward.")
    return "\n".join(lines)


_CHECKS = {
    "render": "recorded prompt = the server's render of the request",
    "regenerate": "greedy re-generation from the recorded prompt = the recorded answer",
    "stream": "streamed = not streamed (answer ids, text, tool calls)",
}


def rewards_cell(p: PathReport) -> str:
    if not p.rewards:
        return "none reported"
    low, high = min(p.rewards), max(p.rewards)
    return f"{len(p.rewards)} of {p.rollouts}, " + (f"{low:g}" if low == high else f"{low:g}–{high:g}")


def _cell(value: Any) -> str:
    text = "—" if value is None else str(value)
    return text.replace("|", "\\|").replace("\n", " ")
