"""examples/swe's task bank, loader, command line and grader: reference fix -> 1, wrong fix -> 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from examples.swe.bank import BANK_SIZE, _mutate, _outcomes, bank, broken_cases, find, make_task
from examples.swe.grader import grade
from examples.swe.library import FAMILIES, MODULES
from examples.swe.task import load_jsonl
from examples.swe.tasks import checkout

REPO = Path(__file__).resolve().parents[2]


def _cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "examples.swe.tasks", *args],
        capture_output=True,
        text=True,
        env=env,
        check=check,
    )


def _apply(patch: str, workdir: Path) -> None:
    subprocess.run(["patch", "-p1", "-s"], input=patch, text=True, cwd=workdir, check=True)


def test_every_mutation_breaks_some_cases_and_keeps_others() -> None:
    for funcs in MODULES.values():
        for func in funcs:
            correct = _outcomes(func, None)
            assert not any(o.startswith("raises") for o in correct), func.name
            for m in func.mutations:
                assert m.family in FAMILIES
                _mutate(func, m)  # its text occurs exactly once
                broken = broken_cases(func, m)
                assert 0 < len(broken) < len(correct), (func.name, m)


def test_bank_is_deterministic_from_its_seed_and_varied() -> None:
    first = bank(0)
    assert len(first) == BANK_SIZE >= 200
    assert [t.instance_id for t in first] == [t.instance_id for t in bank(0)]
    assert first[7] == make_task(7, 0)
    assert [t.instance_id for t in bank(1, 20)] != [t.instance_id for t in first[:20]]
    assert len({t.instance_id for t in first}) == len(first)
    assert {t.family for t in first} == set(FAMILIES)
    for task in first:
        assert task.FAIL_TO_PASS and task.PASS_TO_PASS
        assert not set(task.hidden_files) & set(task.files)
        assert all(t.startswith("tests/test_issue.py::") for t in task.FAIL_TO_PASS)
        assert all(t.split("::")[0] in task.files for t in task.PASS_TO_PASS)
    with pytest.raises(KeyError):
        find("agl-swe__nope.constant__0_9999")


def test_loader_reads_swe_bench_and_swe_smith_lines(tmp_path: Path) -> None:
    swe_bench = {
        "instance_id": "astropy__astropy-12907",
        "repo": "astropy/astropy",
        "base_commit": "d16bfe05a744909de4b27f5875fe0d4ed41ce607",
        "patch": "diff --git a/x b/x\n",
        "test_patch": "diff --git a/t b/t\n",
        "problem_statement": "separability_matrix is wrong",
        "FAIL_TO_PASS": json.dumps(["astropy/modeling/tests/test_separable.py::test_x"]),
        "PASS_TO_PASS": "[]",
        "version": "4.3",
    }
    swe_smith: dict[str, Any] = {
        **swe_bench,
        "instance_id": "a__b.c0ffee.func_pm_op_swap__x1",
        "image_name": "swesmith.x86_64.a__b",
    }
    swe_smith["FAIL_TO_PASS"] = ["tests/test_a.py::test_b"]
    file = tmp_path / "tasks.jsonl"
    file.write_text(json.dumps(swe_bench) + "\n\n" + json.dumps(swe_smith) + "\n")
    a, b = load_jsonl(file)
    assert a.FAIL_TO_PASS == ("astropy/modeling/tests/test_separable.py::test_x",) and a.PASS_TO_PASS == ()
    assert b.image_name == "swesmith.x86_64.a__b" and b.FAIL_TO_PASS == ("tests/test_a.py::test_b",)
    with pytest.raises(ValueError, match="no repository snapshot"):
        checkout(b, tmp_path / "ws")
    r = _cli("--tasks", str(file), "checkout", b.instance_id, str(tmp_path / "ws"), check=False)
    assert r.returncode == 2 and "swesmith.x86_64.a__b" in r.stderr
    file.write_text('{"instance_id": "x"}\n')
    with pytest.raises(ValueError, match="line 1: instance lacks problem_statement"):
        list(load_jsonl(file))


def test_cli_list_checkout_solution_grade(tmp_path: Path) -> None:
    ids = _cli("list").stdout.split()
    assert len(ids) == BANK_SIZE
    assert _cli("list", "--family", "boolean").stdout.split() == [i for i in ids if ".boolean__" in i]
    task_id = ids[5]
    ws = tmp_path / "ws"
    assert _cli("checkout", task_id, str(ws)).returncode == 0
    seen = {p.relative_to(ws).as_posix() for p in ws.rglob("*") if p.is_file()}
    task = find(task_id)
    assert seen == set(task.files) | {"ISSUE.md"}  # no hidden tests, no .git
    assert _cli("checkout", task_id, str(ws), check=False).returncode == 2  # DIR must be new
    before = json.loads(_cli("grade", task_id, str(ws)).stdout)
    assert before["reward"] == 0.0 and set(before["FAIL_TO_PASS"].values()) == {"failed"}
    assert set(before["PASS_TO_PASS"].values()) == {"passed"}
    _apply(_cli("solution", task_id).stdout, ws)
    after = json.loads(_cli("grade", task_id, str(ws)).stdout)
    assert after["reward"] == 1.0 and after["resolved"] is True


def test_wrong_fix_gets_zero_and_partial_credit_is_an_option(tmp_path: Path) -> None:
    task = next(t for t in bank(0, 40) if len(t.FAIL_TO_PASS) >= 2)
    ws = checkout(task, tmp_path / "ws")
    # A "fix" that deletes the buggy module's content breaks its visible tests too.
    module = task.patch.splitlines()[0].split("a/", 1)[1]
    (ws / module).write_text("")
    wrong = grade(task, ws, timeout=120)
    assert wrong.reward == 0.0 and not wrong.resolved
    partial = grade(task, ws, timeout=120, partial=True)
    assert 0.0 < partial.reward < 1.0
    # Reference fix, without the sandbox too.
    (ws / module).write_text(task.files[module])
    _apply(task.patch, ws)
    assert grade(task, ws, timeout=120, sandbox=False).reward == 1.0
