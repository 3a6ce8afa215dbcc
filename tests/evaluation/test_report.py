"""The report from rollout results: per-task numbers, the paired comparison, the markdown, the
JSON written whole, the PNG."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentlightning.evaluation.report import compare, markdown, plot, summarize_policy, write_json
from agentlightning.evaluation.rollouts import RolloutResult, rollout_id, run_key

TASKS = ["a", "b", "c", "d"]


def results(successes: list[int], n: int = 3, failed: int = 0) -> list[RolloutResult]:
    out = []
    for t, c in enumerate(successes):
        for j in range(n):
            state = "failed" if (t == 0 and j < failed) else "succeeded"
            won = j < c and state == "succeeded"
            out.append(RolloutResult(t, j, state, 1.0 if won else 0.0, state == "succeeded", 2, 100, 30))
    return out


def summary(successes: list[int], failed: int = 0) -> dict[str, Any]:
    return summarize_policy(
        results(successes, failed=failed), TASKS, 3, [1, 3], 1.0, seed=0, bootstrap_samples=500
    )


def test_summary_per_task_and_overall() -> None:
    s = summary([3, 1, 0, 2])
    assert [t["successes"] for t in s["tasks"]] == [3, 1, 0, 2]
    assert s["tasks"][1]["pass_at_k"] == {"1": pytest.approx(1 / 3), "3": 1.0}
    assert s["success_rate"]["value"] == pytest.approx(6 / 12)
    assert s["pass_at_k"]["1"]["value"] == pytest.approx(0.5)
    assert s["pass_at_k"]["3"]["value"] == pytest.approx(0.75)  # three of four tasks solved at least once
    low, high = s["mean_reward"]["interval"]
    assert low <= 0.5 <= high
    assert (s["calls_per_rollout"], s["prompt_tokens_per_rollout"]) == (2, 100)
    with pytest.raises(ValueError, match="n results"):
        summarize_policy(results([1, 1, 1, 1])[:-1], TASKS, 3, [1], 1.0, 0, 100)


def test_failed_rollouts_count_as_zero_and_are_reported() -> None:
    s = summary([3, 3, 3, 3], failed=2)
    assert s["failed_rollouts"] == 2 and s["rollouts_without_reward"] == 2
    assert s["tasks"][0]["rewards"] == [0.0, 0.0, 1.0]


def test_comparison_and_markdown() -> None:
    summaries = {"base": summary([3, 0, 0, 2]), "new": summary([3, 3, 1, 0])}
    c = compare("base", "new", summaries, [1, 3], seed=0, samples=500)
    assert c["mean_reward"]["difference"] == pytest.approx((0 + 3 + 1 - 2) / 3 / 4)
    assert c["flips"] == {"gained": ["b"], "lost": ["d"]}  # solved: at least half the samples succeed
    report = {"settings": {"k": [1, 3], "n": 3}, "policies": summaries, "comparisons": [c]}
    table = markdown(report)
    assert "| base | 0.417 [" in table
    assert "| new − base | +0.167 [" in table and "| 1 | 1 |" in table


def test_json_is_written_whole_and_the_plot_exists(tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    write_json(path, {"x": 1})
    assert json.loads(path.read_text()) == {"x": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]  # no temporary left
    summaries = {"base": summary([3, 0, 0, 2]), "new": summary([3, 3, 1, 0])}
    plot({"settings": {"k": [1, 3], "n": 3}, "policies": summaries}, tmp_path / "report.png")
    assert (tmp_path / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rollout_ids_are_fixed_by_what_they_measure() -> None:
    settings = {"data": "h", "temperature": 0.0}
    key = run_key("/ckpt/global_step_10", settings)
    assert key == run_key("/ckpt/global_step_10", dict(settings))
    assert key != run_key("/ckpt/global_step_20", settings)
    assert key != run_key("/ckpt/global_step_10", {**settings, "temperature": 1.0})
    assert rollout_id(key, 3, 2) == f"ev-{key}-t3-s2"
