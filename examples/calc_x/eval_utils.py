"""Calc-X answer checking, as in Agent Lightning v1.0's example, hardened for untrusted answers.

`scalar_are_results_same(pred, true, rel_tol)`: exact match after stripping spaces; then, when
the reference is a multiple-choice letter, the normalised letters; then both sides as numbers
(sympy, compared with `math.isclose`), so `2/3` equals `0.666667` at 1 %.

The prediction is the model's text: it is untrusted. sympy's parser evaluates Python, so a
side is only handed to it after a whitelist check (digits, `+ - * / ( ) .`, spaces, at most
200 characters, no `**`): nothing can run code, and no power tower can hang the agent.
Anything malformed scores False; these functions never raise.
"""

from __future__ import annotations

import math
import re
import string

MAX_EXPRESSION_CHARS = 200
_AROUND = " = around "  # the data set's results look like "2/3 = around 0.666667"
_ARITHMETIC = re.compile(r"^[0-9+\-*/().\s]+$")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")
_OPTION_NOISE = re.compile(r"[\s()\[\]]+")


def normalize_option(option: str) -> str:
    """`" (A) "` → `"A"`; `"b."` → `"B"`."""
    return _OPTION_NOISE.sub("", option).rstrip(".:").upper()


def is_option_result(result: str) -> bool:
    """Whether the reference answer is a multiple-choice letter."""
    letter = normalize_option(result)
    return len(letter) == 1 and letter in string.ascii_uppercase


def safe_arithmetic(text: str) -> str | None:
    """The text as a plain arithmetic expression sympy may parse, or None if it is not one."""
    if _AROUND in text:
        text = text.split(_AROUND)[0]
    text = _THOUSANDS.sub("", text.strip())
    if not text or len(text) > MAX_EXPRESSION_CHARS or "**" in text or not _ARITHMETIC.match(text):
        return None
    return text


def float_eval(text: str) -> float:
    """The value of an arithmetic answer. Raises ValueError when it is not one."""
    expression = safe_arithmetic(text)
    if expression is None:
        raise ValueError(f"not a plain arithmetic expression: {text[:80]!r}")
    from sympy.parsing.sympy_parser import parse_expr  # heavy: only when a number is compared

    value = float(parse_expr(expression, evaluate=True).evalf())
    if not math.isfinite(value):
        raise ValueError(f"{expression!r} is not a finite number")
    return value


def scalar_are_results_same(pred_result: object, true_result: object, rel_tol: float = 1e-2) -> bool:
    """Whether the predicted answer matches the reference (see the module docstring)."""
    pred = pred_result if isinstance(pred_result, str) else "" if pred_result is None else str(pred_result)
    true = true_result if isinstance(true_result, str) else "" if true_result is None else str(true_result)
    if pred.strip() == true.strip():
        return bool(true.strip())
    if is_option_result(true):
        return normalize_option(pred) == normalize_option(true)
    try:
        return math.isclose(float_eval(pred), float_eval(true), rel_tol=rel_tol)
    except Exception:  # sympy raises many kinds (SyntaxError, TypeError, ZeroDivisionError, ...)
        return False
