"""The soak and restart benchmarks, unit-sized: they run end to end and report what they must."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.controller.helpers import REPO


def run_bench(*argv: str, timeout: float = 600) -> str:
    out = subprocess.run(
        [sys.executable, *argv], cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_soak_reports_rounds_and_growth_for_both_stores() -> None:
    out = run_bench(
        "bench/soak.py", "--rounds", "3", "--warmup", "1", "--rollouts", "40", "--concurrency", "8"
    )
    for store in ("sqlite", "memory"):
        assert len(re.findall(rf"ours +{store} +round +\d+: .* RSS .* WAL", out)) == 3, out
        assert re.search(rf"ours +{store}: growth per 1,000 deleted rollouts .* RSS [+-]\d", out), out


def test_restarts_lose_no_rollout() -> None:
    out = run_bench(
        "bench/restarts.py",
        "--phase",
        "services",
        "--rollouts",
        "24",
        "--concurrency",
        "6",
        "--gateway-kills",
        "1",
    )
    assert "SIGKILL gateway" in out and "SIGKILL controller" in out, out
    match = re.search(r"succeeded (\d+), failed (\d+), lost (\d+)", out)
    assert match, out
    assert match.groups() == ("24", "0", "0"), out


@pytest.mark.timeout(900)  # a hang guard: five trainer processes start on a machine that may be busy
def test_trainer_killed_mid_step_resumes_at_its_checkpoint_with_the_reference_runs_data() -> None:
    out = run_bench(
        "bench/restarts.py",
        "--phase",
        "trainer",
        "--train-steps",
        "4",
        "--train-batch",
        "2",
        "--train-group",
        "2",
        "--kill-in-rollouts",
        "2",
        "--kill-in-update",
        "3",
        "--kill-in-save",
        "4",
        "--concurrency",
        "8",
        timeout=850,
    )
    assert "SIGKILL trainer #1 while step" in out, out
    assert "SIGKILL trainer #2 (by itself) in step 3's update" in out, out
    # Killed between the weights and the loop state: the half-written checkpoint is not taken.
    assert "SIGKILL trainer #3 (by itself) in step 4's checkpoint save" in out, out
    assert "newest complete checkpoint: step 3, left behind: ['.global_step_4.tmp']" in out, out
    match = re.search(
        r"resumed at \[(\d+), (\d+), (\d+)\] \(newest complete checkpoints \[(\d+), (\d+), (\d+)\]\)", out
    )
    assert match, out
    resumed, newest = list(map(int, match.groups()[:3])), list(map(int, match.groups()[3:]))
    # Each resume continued from the newest complete checkpoint and redid the step cut off. Where
    # trainer #1's kill landed depends on the machine's speed (step 2's rollouts, or step 3's).
    assert resumed == newest, out
    assert resumed[0] in (1, 2) and resumed[1:] == [2, 3], out
    for n, step in enumerate(resumed, 2):
        assert f"trainer #{n} resumed at step {step}; its first rollouts: step {step + 1}" in out, out
    assert "data per step same as the reference: 4/4" in out, out
    assert "final step 4 version 4 (reference 4 4)" in out, out
    finals = re.findall(
        r"run: final step (\d+), model version (\d+), data position (\d+), optimizer steps (\d+), "
        r"metrics.jsonl steps (\[.*?\]), partial checkpoints left (\[.*?\])",
        out,
    )
    assert finals == [("4", "4", "8", "4", "[1, 2, 3, 4]", "[]")] * 2, out
    counts = re.search(r"(\d+) rollouts: succeeded (\d+), failed (\d+), lost (\d+)", out)
    assert counts and counts.group(4) == "0", out
