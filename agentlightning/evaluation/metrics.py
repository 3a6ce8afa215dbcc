"""The numbers of an evaluation: pass@k, rates and means with 95 % intervals, paired differences.

* pass@k per task is Chen et al.'s (2021) unbiased estimator from `n` samples with `c` successes,
  `1 - C(n-c, k) / C(n, k)`; a policy's pass@k is its mean over the tasks.
* The success rate's interval is Wilson's score interval over all rollouts (it treats the
  rollouts as independent: exact for one sample per task, too narrow where a task's samples
  agree, e.g. greedy decoding with n > 1 — the bootstrap intervals below do not assume that).
* Means over tasks (mean reward, pass@k) get a percentile bootstrap over tasks: tasks are
  resampled with replacement, a task's samples stay together.
* Two policies on the same tasks: the difference of their per-task values, with a paired
  bootstrap over tasks (the same resampled tasks for both), and the tasks that flipped.

Every bootstrap draws from `numpy.random.default_rng(seed)`: the same seed, the same interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

Z95 = 1.959963984540054  # the standard normal's 97.5 % quantile
BOOTSTRAP_SAMPLES = 2000


@dataclass(frozen=True)
class Interval:
    low: float
    high: float

    def as_list(self) -> list[float]:
        return [self.low, self.high]


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of P(at least one of k samples succeeds) from n samples, c of them
    successes (Chen et al. 2021), computed as a product to stay exact for large n."""
    if not 0 <= c <= n:
        raise ValueError(f"successes must be in [0, n={n}], got {c}")
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, n={n}], got {k}")
    if n - c < k:
        return 1.0
    product = 1.0
    for i in range(n - c + 1, n + 1):
        product *= 1.0 - k / i
    return 1.0 - product


def wilson(successes: int, trials: int, z: float = Z95) -> Interval:
    """Wilson's score interval for a binomial rate (95 % by default)."""
    if trials <= 0:
        raise ValueError("the Wilson interval needs at least one trial")
    if not 0 <= successes <= trials:
        raise ValueError(f"successes must be in [0, {trials}], got {successes}")
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return Interval(max(0.0, centre - half), min(1.0, centre + half))


def _percentile(values: np.ndarray) -> Interval:
    low, high = np.percentile(values, [2.5, 97.5])
    return Interval(float(low), float(high))


def bootstrap_mean(
    values: Sequence[float] | np.ndarray, seed: int, samples: int = BOOTSTRAP_SAMPLES
) -> Interval:
    """95 % percentile bootstrap interval of the mean of `values` (one value per task)."""
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        raise ValueError("the bootstrap needs at least one task")
    rng = np.random.default_rng(seed)
    index = rng.integers(0, data.size, size=(samples, data.size))
    return _percentile(data[index].mean(axis=1))


@dataclass(frozen=True)
class PairedDifference:
    """`candidate - baseline`, averaged over tasks, with its paired-bootstrap interval."""

    mean: float
    interval: Interval


def paired_difference(
    baseline: Sequence[float], candidate: Sequence[float], seed: int, samples: int = BOOTSTRAP_SAMPLES
) -> PairedDifference:
    """The mean per-task difference and its 95 % paired bootstrap interval (tasks resampled
    together for both policies, so what the tasks share cancels)."""
    a = np.asarray(baseline, dtype=np.float64)
    b = np.asarray(candidate, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"paired values need the same tasks: {a.size} vs {b.size}")
    diff = b - a
    return PairedDifference(float(diff.mean()), bootstrap_mean(diff, seed, samples))


@dataclass(frozen=True)
class Flips:
    """Tasks a candidate solves that the baseline does not (`gained`), and the reverse (`lost`)."""

    gained: list[str]
    lost: list[str]


def flips(task_ids: Sequence[str], baseline: Sequence[bool], candidate: Sequence[bool]) -> Flips:
    if not len(task_ids) == len(baseline) == len(candidate):
        raise ValueError("flips need one solved flag per task for both policies")
    gained = [t for t, a, b in zip(task_ids, baseline, candidate, strict=True) if b and not a]
    lost = [t for t, a, b in zip(task_ids, baseline, candidate, strict=True) if a and not b]
    return Flips(gained, lost)
