"""The generation engine on its own: stop strings, cancellation, failures, sampling parameters."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest
import torch

from agentlightning.torch_backend.config import load_torch_backend_config
from agentlightning.torch_backend.engine import (
    EngineError,
    IncrementalDetokenizer,
    SamplingParams,
    TorchEngine,
)

from .tiny import fresh_copy

pytestmark = pytest.mark.timeout(600)  # a hang guard, not a speed test: machines may be busy


@pytest.fixture
def engine(tiny_model: Any, tokenizer: Any) -> Any:
    eng = TorchEngine(fresh_copy(tiny_model, tokenizer), tokenizer, max_num_seqs=4)
    yield eng
    eng.close()


def test_detokenizer_streams_text_that_adds_up(tokenizer: Any) -> None:
    text = "héllo wörld 🚀 12+3"
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer)
    deltas = [detok.add(t) for t in ids]
    assert "".join(deltas) == text and "\ufffd" not in "".join(deltas)


def test_stop_string_spanning_tokens_cuts_text_but_keeps_token_ids(engine: TorchEngine) -> None:
    prompt = [5, 6, 7]
    full = engine.generate([prompt], SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))[0]
    text = engine.tokenizer.decode(full.token_ids, skip_special_tokens=True)
    stop = text[8:12]
    cut = engine.generate(
        [prompt], SamplingParams(max_tokens=30, temperature=0, ignore_eos=True, stop=(stop,))
    )[0]
    assert cut.finish_reason == "stop" and cut.stop_reason == stop
    assert cut.text == text[: text.find(stop)]
    assert cut.token_ids == full.token_ids[: len(cut.token_ids)]
    assert engine.tokenizer.decode(cut.token_ids, skip_special_tokens=True).find(stop) >= 0
    kept = engine.generate(
        [prompt],
        SamplingParams(
            max_tokens=30, temperature=0, ignore_eos=True, stop=(stop,), include_stop_str_in_output=True
        ),
    )[0]
    assert kept.text == text[: text.find(stop) + len(stop)]


def test_eos_and_stop_token_ids_end_the_sequence(engine: TorchEngine) -> None:
    sampled = SamplingParams(max_tokens=10, seed=1, ignore_eos=True)
    full = engine.generate([[1, 2]], sampled)[0]
    stop_id = next(t for t in full.token_ids[2:] if t not in engine.eos_ids)
    first = full.token_ids.index(stop_id)
    r = engine.generate([[1, 2]], replace(sampled, ignore_eos=False, stop_token_ids=(stop_id,)))[0]
    assert r.finish_reason == "stop" and r.stop_reason == stop_id
    assert r.token_ids == full.token_ids[: first + 1]  # the stop token is in the ids, not in the text
    assert r.text == engine.tokenizer.decode(full.token_ids[:first], skip_special_tokens=True)


def test_more_sequences_than_slots_all_finish(engine: TorchEngine) -> None:
    prompts = [[i + 1] * (1 + i % 5) for i in range(11)]  # max_num_seqs=4: they queue and join
    results = engine.generate(prompts, SamplingParams(max_tokens=7, temperature=0, ignore_eos=True))
    assert [len(r.token_ids) for r in results] == [7] * 11
    assert engine.stats.max_batch_size == 4
    alone = [
        engine.generate([p], SamplingParams(max_tokens=7, temperature=0, ignore_eos=True))[0] for p in prompts
    ]
    assert [r.token_ids for r in results] == [r.token_ids for r in alone]


async def test_cancel_frees_the_row_and_ends_the_stream(engine: TorchEngine) -> None:
    stream = engine.add_request([[1, 2, 3]], SamplingParams(max_tokens=400, ignore_eos=True), n=2)
    seen = 0
    async for _, out in stream:
        seen += 1
        if seen == 3:
            stream.cancel()
        if out.finish_reason is not None:
            assert out.finish_reason in ("abort", "length")
    assert seen < 2 * 400
    done = await asyncio.to_thread(
        engine.generate, [[4, 5]], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    )
    assert len(done[0].token_ids) == 3


def test_invalid_parameters_and_prompts_are_refused(engine: TorchEngine) -> None:
    with pytest.raises(ValueError, match="top_p"):
        engine.submit([1], SamplingParams(top_p=0.0), lambda o: None)
    with pytest.raises(ValueError, match="max_tokens"):
        engine.submit([1], SamplingParams(max_tokens=0), lambda o: None)
    with pytest.raises(ValueError, match="empty"):
        engine.submit([], SamplingParams(), lambda o: None)
    with pytest.raises(ValueError, match="maximum context length"):
        engine.submit([1] * 500, SamplingParams(max_tokens=20), lambda o: None)


def test_a_failing_forward_pass_fails_its_sequences_not_the_engine(engine: TorchEngine) -> None:
    real_forward = engine.model.forward
    calls = {"n": 0}

    def broken(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("simulated device error")
        return real_forward(*args, **kwargs)

    engine.model.forward = broken
    with pytest.raises(EngineError, match="simulated device error"):
        engine.generate([[1, 2]], SamplingParams(max_tokens=3))
    ok = engine.generate([[1, 2]], SamplingParams(max_tokens=3, ignore_eos=True))[0]
    assert len(ok.token_ids) == 3


def test_seeded_sampling_is_reproducible_and_temperature_changes_it(engine: TorchEngine) -> None:
    p = SamplingParams(max_tokens=20, temperature=1.0, seed=42, ignore_eos=True)
    a, b = engine.generate([[3, 4]], p)[0], engine.generate([[3, 4]], p)[0]
    assert a.token_ids == b.token_ids and a.logprobs == b.logprobs
    assert all(lp <= 0 for lp in a.logprobs) and not any(torch.isnan(torch.tensor(a.logprobs)))
    other = engine.generate(
        [[3, 4]], SamplingParams(max_tokens=20, temperature=1.0, seed=43, ignore_eos=True)
    )[0]
    assert other.token_ids != a.token_ids
    # A very low temperature samples the greedy choice.
    cold = SamplingParams(max_tokens=20, temperature=1e-3, seed=42, ignore_eos=True)
    greedy = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    assert engine.generate([[3, 4]], cold)[0].token_ids == engine.generate([[3, 4]], greedy)[0].token_ids


def test_unseeded_samples_do_not_depend_on_arrival_order(tiny_model: Any, tokenizer: Any) -> None:
    """Identical unseeded requests get distinct samples, and the same set of samples whichever
    order (and batch) they arrive in; a new version gives new samples."""
    p = SamplingParams(max_tokens=12, temperature=1.0, ignore_eos=True)
    prompts = [[3, 4], [3, 4], [3, 4], [5, 6, 7], [3, 4], [5, 6, 7]]

    def samples(order: list[int], max_num_seqs: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        eng = TorchEngine(fresh_copy(tiny_model, tokenizer), tokenizer, max_num_seqs=max_num_seqs, seed=7)
        try:
            outs = [eng.generate([prompts[i]], p)[0] for i in order[:2]]  # one at a time...
            outs += eng.generate([prompts[i] for i in order[2:]], p)  # ...then batched together
        finally:
            eng.close()
        return sorted((tuple(o.prompt_ids), tuple(o.token_ids)) for o in outs)

    first = samples([0, 1, 2, 3, 4, 5], max_num_seqs=4)
    assert samples([5, 4, 3, 2, 1, 0], max_num_seqs=2) == first
    of_prompt = [ids for prompt, ids in first if prompt == (3, 4)]
    assert len(set(of_prompt)) == len(of_prompt) == 4  # four draws, not one repeated

    eng = TorchEngine(fresh_copy(tiny_model, tokenizer), tokenizer, seed=7)
    try:
        before = eng.generate([[3, 4]], p)[0].token_ids
        eng.publish({}, partial=True)  # same weights, next version
        after = eng.generate([[3, 4]], p)[0].token_ids
    finally:
        eng.close()
    assert tuple(before) in of_prompt  # version 0's first draw, as in the engines above
    assert tuple(after) not in of_prompt


def test_sampling_matches_the_model_distribution(tiny_model: Any, tokenizer: Any) -> None:
    """The counter-based uniforms sample tokens at the model's probabilities (one step, many draws)."""
    p = SamplingParams(max_tokens=1, temperature=1.0, ignore_eos=True)
    model = fresh_copy(tiny_model, tokenizer)
    with torch.inference_mode():
        logits = model(torch.tensor([[3, 4]])).logits[0, -1]
    probs = torch.softmax(logits.float(), dim=-1)
    engine = TorchEngine(model, tokenizer, max_num_seqs=256)
    try:
        draws = engine.generate([[3, 4]] * 1000, p)
    finally:
        engine.close()
    counts = torch.bincount(torch.tensor([d.token_ids[0] for d in draws]), minlength=probs.numel())
    top = probs.topk(3).indices
    for token in top.tolist():  # the likeliest tokens: observed frequency within 5 sigma
        expected = 1000 * probs[token].item()
        assert abs(counts[token].item() - expected) <= 5 * (expected * (1 - probs[token].item())) ** 0.5 + 1


def test_backend_config_reads_verl_keys_and_ignores_verl_only_ones() -> None:
    cfg = load_torch_backend_config(
        {
            "actor_rollout_ref": {
                "model": {"path": "demo", "enable_gradient_checkpointing": True},
                "actor": {
                    "optim": {"lr": 1e-3},
                    "clip_ratio_high": 0.28,
                    "strategy": "fsdp",
                    "ppo_epochs": 2,
                },
                "rollout": {"name": "vllm", "n": 8, "temperature": 0.7, "tensor_model_parallel_size": 2},
            },
            "data": {"train_batch_size": 4},
        }
    )
    assert cfg.actor.optim.lr == 1e-3 and cfg.actor.clip_ratio_high == 0.28 and cfg.actor.ppo_epochs == 2
    assert cfg.rollout.n == 8 and cfg.actor.temperature == 0.7 and cfg.actor.gradient_checkpointing
    assert load_torch_backend_config(None).rollout.n == 4
    with pytest.raises(ValueError, match="lr"):
        load_torch_backend_config({"actor_rollout_ref": {"actor": {"optim": {"lr": "fast"}}}})
    with pytest.raises(ValueError, match="kl_loss_type"):
        load_torch_backend_config({"actor_rollout_ref": {"actor": {"kl_loss_type": "nope"}}})
    with pytest.raises(ValueError, match="temperature"):
        load_torch_backend_config({"actor_rollout_ref": {"rollout": {"temperature": 0}}})


@pytest.mark.parametrize(("temperature", "top_p"), [(0.1, 1.0), (0.1, 0.6)])
def test_sampled_tokens_follow_the_reported_distribution(
    engine: TorchEngine, temperature: float, top_p: float
) -> None:
    """4,000 first tokens: their frequencies match softmax(logits / T) (renormalised under top-p)."""
    prompt = [3, 1, 4, 1, 5]
    with torch.no_grad():
        logits = engine.model(torch.tensor([prompt])).logits[0, -1].float()
    probs = torch.softmax(logits / temperature, -1)
    order = probs.argsort(descending=True)
    if top_p < 1.0:
        before = probs[order].cumsum(0) - probs[order]
        keep = order[before < top_p]
        probs = torch.zeros_like(probs).index_fill(0, keep, 1.0) * probs
        probs = probs / probs.sum()
    n = 4000
    results = engine.generate(
        [prompt] * n, SamplingParams(max_tokens=1, temperature=temperature, top_p=top_p)
    )
    counts = torch.bincount(torch.tensor([r.token_ids[0] for r in results]), minlength=probs.numel()).float()
    freq = counts / n
    assert freq[probs == 0].sum() == 0  # nothing outside the nucleus
    for t in order[:5]:
        p = probs[t].item()
        assert abs(freq[t].item() - p) <= 4 * (p * (1 - p) / n) ** 0.5 + 1e-3, (t, freq[t], p)
    # The reported log-prob is that of the temperature-scaled distribution, before truncation.
    first = results[0]
    assert first.logprobs[0] == pytest.approx(
        torch.log_softmax(logits / temperature, -1)[first.token_ids[0]].item(), abs=1e-4
    )
