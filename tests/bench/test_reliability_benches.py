"""The soak and restart benchmarks, unit-sized: they run end to end and report what they must."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.controller.helpers import REPO


def run_bench(*argv: str) -> str:
    out = subprocess.run(
        [sys.executable, *argv], cwd=REPO, capture_output=True, text=True, timeout=600, check=False
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
    out = run_bench("bench/restarts.py", "--rollouts", "24", "--concurrency", "6", "--gateway-kills", "1")
    assert "SIGKILL gateway" in out and "SIGKILL controller" in out, out
    match = re.search(r"succeeded (\d+), failed (\d+), lost (\d+)", out)
    assert match, out
    assert match.groups() == ("24", "0", "0"), out
