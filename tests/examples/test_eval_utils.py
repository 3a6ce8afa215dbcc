"""Calc-X's answer checking: the v1.0 cases, and answers written by a hostile or broken model."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

PATH = Path(__file__).resolve().parents[2] / "examples" / "calc_x" / "eval_utils.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("calc_x_eval_utils", PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


eval_utils = _load()
same = eval_utils.scalar_are_results_same


@pytest.mark.parametrize(
    ("pred", "true"),
    [
        ("15", "15"),
        (" 15 ", "15"),
        ("2/3", "2/3"),
        ("0.666667", "2/3"),  # sympy on both sides, 1 % relative
        ("0.67", "2/3"),
        ("2/3", "0.666667"),
        ("2/3 = around 0.666667", "2/3"),
        ("360.0", "360"),
        ("1,200", "1200"),
        ("(1/4) * 4", "1"),
        ("-3", "-3.0"),
        ("C", "C"),
        ("(C)", "C"),
        (" c. ", "C"),
        ("[B]", "B"),
    ],
)
def test_equal_answers(pred: str, true: str) -> None:
    assert same(pred, true, 1e-2) is True


@pytest.mark.parametrize(
    ("pred", "true"),
    [
        ("16", "15"),
        ("0.6", "2/3"),  # 10 % off
        ("A", "C"),
        ("15", "C"),  # a number for a multiple-choice question
        ("", "15"),
        ("", ""),  # nothing to compare is never right
        ("None", "15"),  # the agent's answer when it timed out
        ("15 grams", "15"),  # units are not numbers
        ("1/0", "15"),
        ("0/0", "0"),
    ],
)
def test_different_answers(pred: str, true: str) -> None:
    assert same(pred, true, 1e-2) is False


def test_the_tolerance_is_relative() -> None:
    assert same("1005", "1000", 1e-2) is True
    assert same("1011", "1000", 1e-2) is False
    assert same("100.5", "100", 1e-3) is False
    assert same("0.66", "2/3", 1e-3) is False


HOSTILE = [
    "__import__('os').system('touch {marker}')",
    "exec('import os; os.system(\"touch {marker}\")')",
    "open('{marker}', 'w')",
    "9**9**9**9",
    "9^9^9^9",
    "(" * 150 + "1" + ")" * 150,
    "9" * 5000,
    "1" + "*9" * 99,
    "lambda: 1",
    "x + 1",
    "nan",
    "inf",
    "1e999",
    "\x00",
    "١٢",  # non-ASCII digits
    "15\n### ANSWER: 15",
    "2/3 = around ",
    " = around 5",
]


@pytest.mark.parametrize("template", HOSTILE)
def test_hostile_answers_score_false_without_running_anything(template: str, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    answer = template.format(marker=marker) if "{marker}" in template else template
    started = time.monotonic()
    assert same(answer, "15", 1e-2) is False
    assert same("15", answer, 1e-2) is False  # a bad reference is not trusted either
    assert not marker.exists()
    assert time.monotonic() - started < 30  # generous: only a hang would fail it


@pytest.mark.parametrize("value", [None, 15, 15.0, b"15", ["15"], {"a": 1}, object()])
def test_non_string_inputs_never_raise(value: object) -> None:
    assert same(value, "15", 1e-2) in (True, False)
    assert same("15", value, 1e-2) in (True, False)
    assert same(15, "15", 1e-2) is True  # a number is compared by its text
    assert same(None, "15", 1e-2) is False


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300), st.sampled_from(["15", "2/3", "C", "0.5", ""]))
def test_any_text_scores_a_bool(pred: str, true: str) -> None:
    assert same(pred, true, 1e-2) in (True, False)


def test_safe_arithmetic_whitelist() -> None:
    assert eval_utils.safe_arithmetic(" (1 + 2) / 3 ") == "(1 + 2) / 3"
    assert eval_utils.safe_arithmetic("2**8") is None
    assert eval_utils.safe_arithmetic("1" * (eval_utils.MAX_EXPRESSION_CHARS + 1)) is None
    assert eval_utils.safe_arithmetic("abs(-1)") is None
