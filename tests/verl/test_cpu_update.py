"""A real verl update on CPU: verl's FSDP2 training worker (`train_mini_batch`, in a subprocess
with the test-only CPU platform) on our batch with our loss gives the torch backend's loss and
gradient norm on the same rows and weights — also with per-token advantages (on-policy
distillation's `token_advantages`), which verl's `ppo_loss` takes as they are."""

from __future__ import annotations

import dataclasses
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.torch_backend.tiny import TINY

from .conftest import REPO, SKIP_REASON

pytest.importorskip("verl", reason=SKIP_REASON)

import torch

from agentlightning.tiny_model import build_tiny, save_tiny
from agentlightning.torch_backend.policy import ActorConfig, PolicyUpdater

from .rows import make_rows, one_minibatch
from .test_loss import model_log_probs

pytestmark = pytest.mark.timeout(600)


# Without the KL term; with it (verl's k3 estimator against a reference model of other weights, so
# the term and its gradient are far from 0), as the backend sets it on verl's actor; and with a
# per-token advantage on every row (distillation's), in place of the rollout's scalar.
CASES = [(None, False), (("low_var_kl", 5.0), False), (None, True)]


@pytest.mark.parametrize(
    ("kl", "per_token"), CASES, ids=["policy_loss", "with_kl_to_a_reference", "token_advantages"]
)
def test_a_real_verl_update_on_cpu_matches_the_torch_backend(
    tmp_path: Path, kl: tuple[str, float] | None, per_token: bool
) -> None:
    micro = 2  # 6 rollouts' rows padded to whole micro-batches of 2
    model, tokenizer = build_tiny(TINY, seed=4)
    model_dir = save_tiny(tmp_path / "tiny", model, tokenizer)
    ref_model, _ = build_tiny(TINY, seed=5)
    kl_args = [str(save_tiny(tmp_path / "ref", ref_model, tokenizer)), kl[0], str(kl[1])] if kl else []
    rows = one_minibatch(make_rows(21, n_groups=2, group_size=3, vocab=200, max_rows_per_rollout=2))
    rng = random.Random(0)
    with torch.no_grad():  # rollout log-probs near the model's: some ratios clip, some do not
        for row in rows:
            lp = model_log_probs(model, row)
            row.rollout_log_probs = [
                float(v) + rng.gauss(0, 0.3) if m else 0.0 for v, m in zip(lp, row.response_mask, strict=True)
            ]
            if per_token:  # of either sign within a row, 0 on context (as trainer/distill.py makes them)
                row.token_advantages = [rng.gauss(0, 1.0) if m else 0.0 for m in row.response_mask]
    rows_path = tmp_path / "rows.json"
    rows_path.write_text(json.dumps([dataclasses.asdict(r) for r in rows]))

    result = subprocess.run(
        [sys.executable, "-m", "tests.verl.cpu_update", str(model_dir), str(rows_path), str(micro), *kl_args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=540,
    )
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith("VERL_METRICS ")]
    assert result.returncode == 0 and lines, result.stderr[-3000:]
    verl = json.loads(lines[-1].removeprefix("VERL_METRICS "))

    kl_config = {"use_kl_loss": True, "kl_loss_type": kl[0], "kl_loss_coef": kl[1]} if kl else {}
    updater = PolicyUpdater(
        model,
        ActorConfig(clip_ratio_high=0.28, ppo_micro_batch_size_per_gpu=micro, **kl_config),  # type: ignore[arg-type]
        device="cpu",
        ref_model=ref_model if kl else None,
    )
    stats = updater.backward(rows)
    grad_norm = torch.nn.utils.clip_grad_norm_(updater.model.parameters(), float("inf")).item()
    # What this case adds (the KL term, the per-token advantages) weighs in the gradient: without it
    # (no KL term; the rollout's scalar advantage) the gradient differs, so it is there to match.
    if kl or per_token:
        plain_rows = [dataclasses.replace(r, token_advantages=None) for r in rows] if per_token else rows
        model.zero_grad(set_to_none=True)  # the same parameters: the other loss's gradient alone
        plain = PolicyUpdater(
            model, ActorConfig(clip_ratio_high=0.28, ppo_micro_batch_size_per_gpu=micro), device="cpu"
        )
        plain.backward(plain_rows)
        plain_norm = torch.nn.utils.clip_grad_norm_(plain.model.parameters(), float("inf")).item()
        assert abs(grad_norm - plain_norm) > 0.05 * plain_norm

    assert sum(verl["actor/pg_loss"]) == pytest.approx(stats["pg_loss"], abs=1e-5)
    assert verl["grad_norm"][0] == pytest.approx(grad_norm, rel=1e-5)  # measured: equal to all digits
    assert 0 < verl["actor/pg_clipfrac"][0] < 1  # clipping was exercised
    if kl:
        assert stats["kl_loss"] > 1e-3
        assert sum(verl["kl_loss"]) == pytest.approx(stats["kl_loss"], rel=1e-5)
