"""The eval's statistics against what they estimate: pass@k against enumeration, Wilson against
its known values, the bootstraps' determinism, the paired difference and the flips."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest

from agentlightning.evaluation.metrics import (
    bootstrap_mean,
    flips,
    paired_difference,
    pass_at_k,
    wilson,
)


def brute_force_pass_at_k(outcomes: list[bool], k: int) -> float:
    """The share of the k-subsets of the samples holding at least one success."""
    subsets = list(itertools.combinations(outcomes, k))
    return sum(any(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_pass_at_k_equals_enumeration_of_subsets(n: int) -> None:
    for c in range(n + 1):
        outcomes = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_force_pass_at_k(outcomes, k), abs=1e-12)


def test_pass_at_k_is_exact_for_large_n() -> None:
    # 1 - C(n-c, k) / C(n, k) with exact integers: the product form must agree.
    n, c, k = 200, 7, 50
    exact = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-12)
    assert pass_at_k(10, 0, 3) == 0.0
    assert pass_at_k(10, 8, 3) == 1.0  # fewer than k failures: every k-subset has a success


@pytest.mark.parametrize(("n", "c", "k"), [(3, 1, 4), (3, 1, 0), (3, 4, 1), (3, -1, 1)])
def test_pass_at_k_refuses_impossible_arguments(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_wilson_matches_published_values() -> None:
    # Newcombe (1998), Table I: 81/263 -> 0.2553 to 0.3662; 15/148 -> 0.0624 to 0.1605.
    ci = wilson(81, 263)
    assert (round(ci.low, 4), round(ci.high, 4)) == (0.2553, 0.3662)
    ci = wilson(15, 148)
    assert (round(ci.low, 4), round(ci.high, 4)) == (0.0624, 0.1605)
    # At the edges it stays inside [0, 1] and is not degenerate.
    zero, full = wilson(0, 10), wilson(10, 10)
    assert zero.low == 0.0 and 0.2 < zero.high < 0.35
    assert full.high == pytest.approx(1.0) and 0.65 < full.low < 0.8
    with pytest.raises(ValueError):
        wilson(0, 0)


def test_bootstrap_is_deterministic_in_its_seed_and_covers_the_mean() -> None:
    rng = random.Random(3)
    values = [rng.random() for _ in range(40)]
    a, b = bootstrap_mean(values, seed=7), bootstrap_mean(values, seed=7)
    assert a == b
    assert bootstrap_mean(values, seed=8) != a
    assert a.low < float(np.mean(values)) < a.high
    # The interval's width is about 2 × 1.96 × the standard error of the mean.
    se = float(np.std(values)) / math.sqrt(len(values))
    assert 0.7 * 3.92 * se < a.high - a.low < 1.3 * 3.92 * se
    constant = bootstrap_mean([0.5] * 10, seed=0)
    assert (constant.low, constant.high) == (0.5, 0.5)


def test_paired_difference_cancels_what_the_tasks_share() -> None:
    rng = random.Random(0)
    difficulty = [rng.random() for _ in range(60)]  # large spread across tasks
    baseline = difficulty
    candidate = [d + 0.1 for d in difficulty]  # every task exactly 0.1 better
    d = paired_difference(baseline, candidate, seed=1)
    assert d.mean == pytest.approx(0.1)
    assert d.interval.low == pytest.approx(0.1) and d.interval.high == pytest.approx(0.1)
    # Unpaired, the spread of the tasks would swamp the difference.
    unpaired = bootstrap_mean(candidate, 1).low - bootstrap_mean(baseline, 1).high
    assert unpaired < 0
    noisy = paired_difference(baseline, [c + rng.gauss(0, 0.05) for c in candidate], seed=1)
    assert noisy.interval.low < noisy.mean < noisy.interval.high
    assert paired_difference(baseline, candidate, seed=1) == d  # seeded
    with pytest.raises(ValueError, match="same tasks"):
        paired_difference([1.0], [1.0, 2.0], seed=0)


def test_flips_name_the_tasks_gained_and_lost() -> None:
    f = flips(["a", "b", "c", "d"], [True, False, True, False], [True, True, False, False])
    assert (f.gained, f.lost) == (["b"], ["c"])
    with pytest.raises(ValueError):
        flips(["a"], [True], [])
