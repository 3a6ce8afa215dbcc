"""scripts/gpu_check.py in its CPU mode (tiny sizes), so that the GPU check cannot rot between GPU runs.

The script runs as a user runs it: a child process whose last line of output is the JSON summary.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.py"


def run_check(tmp_path: Path, *args: str, timeout: float) -> tuple[int, dict[str, Any], str]:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--work", str(tmp_path / "work"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = proc.stdout.strip().splitlines()
    assert lines, proc.stderr
    return proc.returncode, json.loads(lines[-1]), proc.stdout + proc.stderr


def load_script() -> Any:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(1700)  # the script's own budget (1500 s) stops a hang first; ~2 min on CI
def test_cpu_mode_runs_every_part_and_reports_sane_figures(tmp_path: Path) -> None:
    code, summary, output = run_check(tmp_path, "--device", "cpu", timeout=1600)
    parts = summary["parts"]
    assert code == 0 and summary["ok"] and summary["failed"] == [], output
    assert summary["device"] == "cpu" and summary["size"] == "tiny"
    assert list(parts) == ["env", "engine", "update", "mismatch", "demo"]
    assert 0 < summary["wall_s"] <= summary["budget_s"]
    for name, part in parts.items():
        assert part["ok"] and 0 < part["wall_s"] <= part["budget_s"], name

    env = parts["env"]
    assert env["cuda_available"] is False and env["torch"] and env["transformers"]
    assert Path(env["agentlightning"]) == REPO / "agentlightning"  # the checkout, not another copy
    assert set(env["imports"].values()) == {"ok"}

    engine = parts["engine"]
    assert engine["dtype"] == "bfloat16"
    assert set(engine["models"]) == {"demo", "qwen2.5-0.5b-shape"}
    for model in engine["models"].values():
        assert model["params"] > 0
        assert set(model["concurrency"]) == {"1", "8", "64"}
        for clients, figures in model["concurrency"].items():
            assert figures["tokens"] == int(clients) * engine["gen_len"] * engine["requests_per_client"]
            assert figures["tokens_per_s"] > 0 and figures["seconds"] > 0
        assert model["concurrency"]["1"]["mean_batch"] == 1.0
        assert model["concurrency"]["64"]["mean_batch"] > 1.0  # requests were batched together

    update = parts["update"]
    assert update["tokens_per_update"] == update["rows"] * update["row_tokens"]
    assert update["tokens_per_s"] > 0 and update["grad_norm_finite"] and update["grad_norm"] > 0
    assert update["peak_memory_kind"] == "process_max_rss" and update["peak_memory_bytes"] > 0
    assert update["autocast"] is None  # fp32 on CPU

    mismatch = parts["mismatch"]
    for model in mismatch["models"].values():
        assert set(model) == {"fp32", "bf16", "bf16_engine_fp32_policy"}
        for figures in model.values():
            assert figures["tokens"] == mismatch["prompts"] * mismatch["tokens_per_prompt"]
            assert math.isfinite(figures["mean_abs"]) and figures["max_abs"] >= figures["mean_abs"]
        # fp32: the engine reports what the policy recomputes, to float precision; bf16 does not.
        assert model["fp32"]["mean_abs"] < 1e-4
        assert model["bf16"]["mean_abs"] > model["fp32"]["mean_abs"]

    demo = parts["demo"]
    assert demo["device"] == "cpu" and demo["steps"] == 1
    assert [step for step, _ in demo["val_reward"]] == [0, 1]
    assert 0.0 <= demo["val_reward_before"] <= 1.0 and 0.0 <= demo["val_reward_after"] <= 1.0
    assert demo["gateway_log_tracebacks"] == 0  # a clean run's shutdown logs no error
    assert f"validation reward: {demo['val_reward_before']:.3f} -> {demo['val_reward_after']:.3f}" in (
        (tmp_path / "work" / "demo.log").read_text()
    )


@pytest.mark.timeout(600)
def test_a_part_past_its_budget_is_stopped_and_reported_and_the_rest_still_run(tmp_path: Path) -> None:
    code, summary, output = run_check(
        tmp_path, "--device", "cpu", "--parts", "engine", "--part-budget", "engine=1", timeout=580
    )
    assert code == 1 and not summary["ok"] and summary["failed"] == ["engine"], output
    engine = summary["parts"]["engine"]
    assert engine["timed_out"] and engine["budget_s"] == 1 and "budget of 1 s" in engine["error"]
    assert engine["wall_s"] < 60  # stopped, not waited for
    assert summary["parts"]["env"]["ok"]


@pytest.mark.timeout(600)
def test_without_the_device_the_parts_are_skipped_with_the_reason(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    code, summary, _ = run_check(tmp_path, "--device", "cuda", "--size", "tiny", timeout=580)
    parts = summary["parts"]
    assert code == 1 and not parts["env"]["ok"] and "sees no CUDA device" in parts["env"]["error"]
    for name in ("engine", "update", "mismatch", "demo"):
        assert parts[name] == {"ok": False, "skipped": "the env part failed"}


def test_requirements_come_from_the_wheel_metadata_core_and_train_extra(tmp_path: Path) -> None:
    wheel = tmp_path / "agentlightning-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(
            "agentlightning-0.1.0.dist-info/METADATA",
            "Metadata-Version: 2.1\nName: agentlightning\n"
            "Requires-Dist: fastapi>=0.110\n"
            "Requires-Dist: uvicorn[standard]>=0.29\n"
            'Requires-Dist: tomli; python_version < "3.11"\n'
            'Requires-Dist: torch>=2.4; extra == "train"\n'
            "Requires-Dist: openai>=1.40; extra == 'train'\n"
            'Requires-Dist: kr8s>=0.17; extra == "k8s"\n',
        )
    gpu_check = load_script()
    assert gpu_check.requirements(wheel) == [
        "fastapi>=0.110",
        "uvicorn[standard]>=0.29",
        'tomli; python_version < "3.11"',
        "torch>=2.4",
        "openai>=1.40",
    ]
    assert [gpu_check._dist_name(r) for r in gpu_check.requirements(wheel)] == [
        "fastapi",
        "uvicorn",
        "tomli",
        "torch",
        "openai",
    ]
