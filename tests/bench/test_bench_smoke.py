"""Every benchmark under bench/ runs: each in its `--smoke` mode (tiny sizes, a few seconds), in its
own process under a deadline, and prints the table or ratio it exists for. The numbers are not
checked (a loaded machine changes them); that the script runs end to end and reports is.
bench/soak.py and bench/restarts.py are run by tests/bench/test_reliability_benches.py."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.heavy import require
from tests.local_postgres import find_bin_dir

REPO = Path(__file__).resolve().parents[2]
EXAMPLES_PYTHON = REPO / ".venv-examples" / "bin" / "python"

# script, interpreter, what its report must contain
SMOKES = {
    # calls/s and the ratio to direct, on pass-through and the token path, with no failed call
    "proxy": (
        sys.executable,
        r"via ours +\d+ +\d+\.\d\d( +[-+\d.]+){4} +0 .*\n.*via exact +\d+ +\d+\.\d\d( +[-+\d.]+){4} +0 ",
    ),
    "store": (sys.executable, r"through the Gateway \d+\.\d\dx"),
    "collect": (sys.executable, r"speed-up: fetch x[\d.]+, aggregation x[\d.]+, total x[\d.]+"),
    "controller": (sys.executable, r"warm start is +[\d.]+x the fresh interpreter"),
    "replicas": (sys.executable, r"postgres x1 +\d+ +\d\.\d\d"),
    "retrieval_latency": (str(EXAMPLES_PYTHON), r"ratio service / in-process \(p50\): [\d.]+"),
    "merge_report": (sys.executable, r"\| gsm8k: plain `openai` client tool loop \| \d\.\d\d \|"),
    "doctor_table": (
        sys.executable,
        r"\| gsm8k: plain `openai` client tool loop \| .* \| \*\*trainable\*\* \|\n"
        r"\| Search-R1: .* \| \*\*trainable\*\* \|",
    ),
    "learning": (
        sys.executable,
        r"\| grpo \| 1 \| \d\.\d{3} \| \d\.\d{3} \| \d\.\d{3} \| \d\.\d{3} \| \d+\.\d \| \d+ \|",
    ),
    "chaos": (sys.executable, r"\| typed \| \d\.\d{3} \| .* \| \d+\.\d% \| \d+\.\d% \|"),
    "metrics_hot_path": (sys.executable, r"ratio: [\d.]+x cheaper"),
    "upstream_clients": (sys.executable, r"8 +10ms +aiohttp +\d+ +[\d.]+ +[\d.]+ +[\d.]+ +0\n"),
    "record": (sys.executable, r"long agent's call .* after/before [\d.]+"),
    "vllm_mismatch": (sys.executable, r"\| float32 \| \d+ / \d+ \| \d\.\d\de[-+]\d+ / "),
    "engines": (sys.executable, r"\| demo \| tok_s@4 \| [\d.]+ \|"),
    "demo_feasibility": (sys.executable, r'\{"summary": \{"seed": 0, "warmup_s": [\d.]+, .*"steps": 2, '),
    "opd": (sys.executable, r"\| opd \(teacher: the GRPO run's checkpoint\) \| \d\.\d{3} \| \d\.\d{3} \|"),
    "rft": (sys.executable, r"validation reward \(greedy, 4 problems\): \d\.\d{3} -> \d\.\d{3}"),
    "lora_publish": (sys.executable, r"demo +torch +[\d.]+ +[\d.]+ +[\d.]+x +0\.63 +0\.070 +9\.1x"),
    "stream_ttfb": (sys.executable, r"the Gateway adds [+-][\d.]+ ms to the first token, [\d.]+x the whole"),
}


def _missing(name: str) -> str | None:
    if name in ("retrieval_latency", "merge_report", "doctor_table") and not EXAMPLES_PYTHON.exists():
        return f"{EXAMPLES_PYTHON} is missing (make examples-venv)"  # the examples' agents and search
    if name == "replicas" and find_bin_dir() is None:
        return "PostgreSQL server binaries are missing (Debian: apt-get install postgresql)"
    return None


def test_every_bench_script_is_smoke_tested_or_a_helper() -> None:
    """A new bench script gets a smoke run here (or is a helper another script runs)."""
    helpers = {
        "controller_agents",
        "controller_openai_agent",
        "restarts_agent",
        "restarts_trainer",
        "model_sizes",
        "chaos_agent",  # the naive agent bench/chaos.py trains
    }
    reliability = {"soak", "restarts"}  # tests/bench/test_reliability_benches.py
    scripts = {p.stem for p in (REPO / "bench").glob("*.py") if p.stem != "__init__"}
    assert scripts == set(SMOKES) | helpers | reliability


SMOKE_DEADLINE = 900  # seconds: a hang guard, not a speed test (a smoke run is seconds to minutes)


@pytest.mark.timeout(SMOKE_DEADLINE + 60)  # the run's own deadline comes first and shows its output
@pytest.mark.parametrize("name", sorted(SMOKES))
def test_bench_smoke(name: str) -> None:
    require(_missing(name))
    interpreter, report = SMOKES[name]
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # bench.* and this tree's agentlightning
    # In a session of its own: a run stopped before its end is stopped as Ctrl-C stops it, so that
    # it stops what it started (a timed-out run of bench/opd.py once left its teacher server running).
    with subprocess.Popen(
        [interpreter, f"bench/{name}.py", "--smoke"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=SMOKE_DEADLINE)
        except BaseException:
            interrupt(proc)
            raise
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    assert re.search(report, stdout), stdout[-3000:]


def interrupt(proc: subprocess.Popen[str], grace: float = 60) -> None:
    """Ctrl-C to the run's session, SIGKILL to what is left of it after `grace` seconds; its
    output's end is printed (pytest shows it with the failure)."""
    for sig, wait in ((signal.SIGINT, grace), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            stdout, stderr = proc.communicate(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        print(stdout[-3000:] + stderr[-3000:])
        break
