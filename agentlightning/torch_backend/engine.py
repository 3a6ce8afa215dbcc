"""Generation engine: continuous batching over a Hugging Face causal LM, on CPU or CUDA.

One background thread owns the model. Sequences join the running batch at any decode step:
new prompts are prefilled together (left-padded), their KV cache is left-padded to the running
batch's length and concatenated; finished sequences leave by row selection; columns that only
hold padding are trimmed. Each sequence has its own sampling parameters (temperature, top-p,
top-k, seed) and stop conditions, and receives one `StepOutput` per generated token.

Log-probs. The reported log-prob of a token is `log_softmax(logits / T)` at the sampled token,
with `T` the request's temperature (`T = 0`, greedy, reports `log_softmax(logits)`), taken
before top-p/top-k truncation. The policy update recomputes exactly this quantity (logits of
the same weights divided by the rollout temperature), so the PPO ratio is 1 on fresh data and
the two agree to float precision in fp32. Truncation is not reflected, as in verl+vLLM.

Sampling randomness. Each sequence draws its uniforms from a counter-based stream (SplitMix64
of a per-sequence key and the token's index), vectorised over the batch. The key is the
request's `seed` when it has one; otherwise it is derived from the engine's seed, the weights'
version, the prompt, the sampling settings and how many identical requests came before at this
version. So a run is reproducible however its requests interleave: the k-th identical request
gets the same sample whichever agent sent it (samples of one prompt are exchangeable in a group).

Weight publishing. `publish()` hands new weights to the engine thread, which stops admitting
new sequences, lets the running ones finish on the old weights, swaps the weights in place,
bumps the version and resumes. Requests that arrive meanwhile wait in the queue; none fail, and
every answer comes from exactly one version. (The trainer drains the Gateway first, so the
engine is normally idle and the swap is immediate.)
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from agentlightning.log import get_logger
from agentlightning.torch_backend import hf_compat
from agentlightning.wire import ids_to_bytes

log = get_logger("torch_engine")


class EngineError(RuntimeError):
    """The engine failed while generating; the affected sequences end with this message."""


@dataclass(frozen=True)
class SamplingParams:
    """Per-sequence generation settings (the OpenAI/vLLM request fields)."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    top_logprobs: int = 0
    # Incremental text per token (streaming); stop strings turn it on regardless.
    detokenize: bool = False

    def validate(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if not 0.0 <= self.temperature <= 100.0:
            raise ValueError(f"temperature must be in [0, 100], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or positive, got {self.top_k}")
        if not 0 <= self.top_logprobs <= 20:
            raise ValueError(f"top_logprobs must be in [0, 20], got {self.top_logprobs}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must not be empty")


@dataclass(slots=True)
class StepOutput:
    """One generated token of one sequence."""

    token_id: int
    logprob: float
    top_logprobs: list[tuple[int, float]] | None = None
    # Text this token adds (only when the sequence detokenizes); "" while text is held back.
    text_delta: str | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort" on the last token
    stop_reason: str | int | None = None
    error: str | None = None
    version: int = 0


@dataclass
class SequenceResult:
    """A finished sequence, as `generate()` returns it."""

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]]
    text: str
    finish_reason: str
    stop_reason: str | int | None
    version: int


_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MAX_REPEATS = 1 << 20  # distinct unseeded requests remembered per version (~150 MB at most)


def _mix64(value: int) -> int:
    """SplitMix64's finaliser: a user's small seeds (0, 1, 2...) become unrelated stream keys."""
    z = (value + _GOLDEN) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _uniforms(keys: Sequence[int], counters: Sequence[int]) -> np.ndarray:
    """Uniforms in [0, 1): SplitMix64 output `counter` of the stream `key`, for all rows at once
    (uint64 arithmetic wraps, as SplitMix64 wants)."""
    z = np.array(keys, dtype=np.uint64) + (np.array(counters, dtype=np.uint64) + np.uint64(1)) * np.uint64(
        _GOLDEN
    )
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


class IncrementalDetokenizer:
    """Text deltas token by token (vLLM's prefix/read-offset scheme); holds back partial UTF-8."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""
        self._prefix = 0
        self._read = 0

    def add(self, token_id: int) -> str:
        self.ids.append(token_id)
        prefix_text = self.tokenizer.decode(self.ids[self._prefix : self._read], skip_special_tokens=True)
        new_text = self.tokenizer.decode(self.ids[self._prefix :], skip_special_tokens=True)
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            delta = new_text[len(prefix_text) :]
            self._prefix = self._read
            self._read = len(self.ids)
            self.text += delta
            return delta
        return ""


@dataclass(eq=False)
class _Seq:
    prompt_ids: list[int]
    params: SamplingParams
    sink: Callable[[StepOutput], None]
    key: int = 0  # the sampling stream's key (see "Sampling randomness")
    out_ids: list[int] = field(default_factory=list)
    detok: IncrementalDetokenizer | None = None
    emitted: int = 0  # characters of detok.text already delivered
    cancelled: bool = False
    finished: bool = False

    def cancel(self) -> None:
        self.cancelled = True


class RequestStream:
    """An async view of one request's sequences: iterate `(index, StepOutput)` pairs.

    Index `i` is sequence `i` of the request (prompt `i // n`, sample `i % n`). Iteration ends
    when every sequence has finished; `cancel()` frees their rows (a client went away).
    """

    def __init__(self, engine: TorchEngine, queue: asyncio.Queue[tuple[int, StepOutput]]) -> None:
        self._engine = engine
        self._queue = queue
        self.seqs: list[_Seq] = []

    def cancel(self) -> None:
        for seq in self.seqs:
            seq.cancel()
        self._engine._wake()

    async def __aiter__(self) -> AsyncIterator[tuple[int, StepOutput]]:
        left = len(self.seqs)
        while left:
            index, out = await self._queue.get()
            if out.finish_reason is not None:
                left -= 1
            yield index, out


@dataclass
class _Swap:
    weights: Mapping[str, torch.Tensor] | torch.nn.Module
    version: int | None
    partial: bool = False  # only some of the weights (a LoRA adapter's); the rest stay
    done: threading.Event = field(default_factory=threading.Event)
    result: int | None = None
    error: BaseException | None = None


@dataclass
class EngineStats:
    steps: int = 0
    prefills: int = 0
    admitted: int = 0  # sequences that entered the running batch
    generated_tokens: int = 0
    max_batch_size: int = 0
    batch_sizes: deque[int] = field(default_factory=lambda: deque(maxlen=4096))


class TorchEngine:
    """Continuous-batching generation over `model` (a Hugging Face causal LM) in a worker thread."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_num_seqs: int = 256,
        max_model_len: int | None = None,
        max_num_batched_tokens: int = 16384,
        seed: int = 0,
        version: int = 0,
    ) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.max_num_seqs = max_num_seqs
        config_len = getattr(model.config, "max_position_embeddings", None) or 4096
        self.max_model_len = int(max_model_len or config_len)
        self.max_num_batched_tokens = max_num_batched_tokens
        self.pad_id = self._pad_id()
        self.eos_ids = self._eos_ids()
        self.stats = EngineStats()
        self._version = version
        self._seed = seed
        # Identical unseeded requests seen at `_repeats_version`: their count is part of the key.
        self._repeats: dict[bytes, int] = {}
        self._repeats_version = version
        self._cv = threading.Condition()
        self._pending: deque[_Seq] = deque()
        self._swaps: deque[_Swap] = deque()
        self._closing = False
        # Running batch (engine thread only).
        self._rows: list[_Seq] = []
        self._kv: hf_compat.KV | None = None
        self._mask: torch.Tensor | None = None  # [B, S] 1 = real token
        self._positions: torch.Tensor | None = None  # [B] position of the next fed token
        self._logits: torch.Tensor | None = None  # [B, V] next-token logits
        self._thread = threading.Thread(target=self._loop, name="agl-torch-engine", daemon=True)
        self._thread.start()

    # --- public API ---------------------------------------------------------------------------

    @property
    def version(self) -> int:
        return self._version

    @property
    def swap_pending(self) -> bool:
        """A publish is waiting for running sequences to finish (new ones wait meanwhile)."""
        return bool(self._swaps)

    def check_prompt(self, prompt_ids: Sequence[int], max_tokens: int | None) -> int:
        """Validate a prompt; return the effective max_tokens. Raises ValueError with the reason."""
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        vocab = self.model.config.vocab_size
        bad = [t for t in prompt_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token id {bad[0]} is out of range [0, {vocab})")
        room = self.max_model_len - len(prompt_ids)
        if room < 1:
            raise ValueError(
                f"this model's maximum context length is {self.max_model_len} tokens; "
                f"the prompt has {len(prompt_ids)} tokens"
            )
        if max_tokens is None:
            return room
        if max_tokens > room:
            raise ValueError(
                f"this model's maximum context length is {self.max_model_len} tokens; you requested "
                f"{len(prompt_ids) + max_tokens} tokens ({len(prompt_ids)} in the prompt, "
                f"{max_tokens} for the completion); reduce max_tokens or the prompt"
            )
        return max_tokens

    def submit(
        self, prompt_ids: Sequence[int], params: SamplingParams, sink: Callable[[StepOutput], None]
    ) -> _Seq:
        """Queue one sequence; `sink` receives its outputs in the engine thread."""
        return self.submit_many([(prompt_ids, params, sink)])[0]

    def submit_many(
        self, items: Sequence[tuple[Sequence[int], SamplingParams, Callable[[StepOutput], None]]]
    ) -> list[_Seq]:
        """Queue sequences together (all valid or none queued), so that they share one prefill."""
        seqs = []
        for prompt_ids, params, sink in items:
            params.validate()
            self.check_prompt(prompt_ids, params.max_tokens)
            seq = _Seq(list(prompt_ids), params, sink)
            if params.detokenize or params.stop:
                seq.detok = IncrementalDetokenizer(self.tokenizer)
            seqs.append(seq)
        with self._cv:
            if self._closing:
                raise EngineError("the engine is shut down")
            for seq in seqs:
                seq.key = self._sampling_key(seq.prompt_ids, seq.params)
            self._pending.extend(seqs)
            self._cv.notify()
        return seqs

    def _sampling_key(self, prompt_ids: list[int], params: SamplingParams) -> int:
        """The key of a sequence's random stream (under `_cv`): see "Sampling randomness"."""
        if params.seed is not None:
            return _mix64(params.seed)
        if self._repeats_version != self._version or len(self._repeats) >= _MAX_REPEATS:
            self._repeats.clear()  # a new version starts new streams; the bound keeps memory flat
            self._repeats_version = self._version
        request = hashlib.blake2b(ids_to_bytes(prompt_ids) or b"", digest_size=16)
        request.update(repr(params).encode())
        digest = request.digest()
        count = self._repeats.get(digest, 0)
        self._repeats[digest] = count + 1
        key = hashlib.blake2b(digest, digest_size=8, key=f"{self._seed}/{self._version}/{count}".encode())
        return int.from_bytes(key.digest(), "little")

    def add_request(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, n: int = 1
    ) -> RequestStream:
        """Queue `n` samples of each prompt; call from a running event loop. Seeds are `seed + i`."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[int, StepOutput]] = asyncio.Queue()
        stream = RequestStream(self, queue)
        items = []
        for j, prompt in enumerate(prompts):
            for i in range(n):
                index = j * n + i
                sp = (
                    params if params.seed is None or index == 0 else replace(params, seed=params.seed + index)
                )
                items.append((prompt, sp, _threadsafe_put(loop, queue, index)))
        stream.seqs = self.submit_many(items)
        return stream

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, timeout: float | None = None
    ) -> list[SequenceResult]:
        """Blocking: generate one sequence per prompt (all batched together)."""
        done = threading.Semaphore(0)
        outs: list[list[StepOutput]] = [[] for _ in prompts]

        def sink_for(i: int) -> Callable[[StepOutput], None]:
            def sink(out: StepOutput) -> None:
                outs[i].append(out)
                if out.finish_reason is not None:
                    done.release()

            return sink

        seqs = self.submit_many([(p, params, sink_for(i)) for i, p in enumerate(prompts)])
        deadline = None if timeout is None else time.monotonic() + timeout
        for _ in prompts:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not done.acquire(timeout=left):
                for s in seqs:
                    s.cancel()
                raise TimeoutError(f"generation did not finish within {timeout}s")
        return [self._result(p, o) for p, o in zip(prompts, outs, strict=True)]

    def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """Per sequence, the log-prob of each token after the first given the tokens before it
        (`log_softmax` of the logits, temperature 1): the prompt log-probs a teacher gives a
        student's tokens (on-policy distillation). Runs in the caller's thread on the served
        weights, one sequence at a time, beside the generation loop (a forward pass changes no
        state of the model)."""
        out: list[list[float]] = []
        with torch.inference_mode():
            for seq in sequences:
                ids = torch.tensor([list(seq)], dtype=torch.long, device=self.device)
                positions = torch.arange(ids.shape[1], device=self.device).unsqueeze(0)
                logits, _ = hf_compat.forward(
                    self.model, ids, torch.ones_like(ids), positions, use_cache=False
                )
                lp = torch.log_softmax(logits[0, :-1].float(), dim=-1)
                out.append(lp.gather(-1, ids[0, 1:].unsqueeze(-1)).squeeze(-1).tolist())
        return out

    def publish(
        self,
        weights: Mapping[str, torch.Tensor] | torch.nn.Module,
        version: int | None = None,
        timeout: float | None = None,
        partial: bool = False,
    ) -> int:
        """Swap in new weights once running sequences finish; return the new version (blocking).
        `partial`: `weights` names only some of the model's tensors (a LoRA adapter's), each of
        which must exist; the others are kept."""
        swap = _Swap(weights, version, partial)
        with self._cv:
            if self._closing:
                raise EngineError("the engine is shut down")
            self._swaps.append(swap)
            self._cv.notify()
        if not swap.done.wait(timeout):
            raise TimeoutError(f"weights were not swapped within {timeout}s")
        if swap.error is not None:
            raise EngineError(f"weight swap failed: {swap.error}") from swap.error
        assert swap.result is not None
        return swap.result

    async def apublish(
        self, weights: Mapping[str, torch.Tensor] | torch.nn.Module, version: int | None = None
    ) -> int:
        return await asyncio.to_thread(self.publish, weights, version)

    def close(self, timeout: float = 10.0) -> None:
        with self._cv:
            self._closing = True
            self._cv.notify()
        self._thread.join(timeout)

    # --- engine thread ------------------------------------------------------------------------

    def _wake(self) -> None:
        with self._cv:
            self._cv.notify()

    def _loop(self) -> None:
        torch.set_grad_enabled(False)
        while True:
            with self._cv:
                while not (self._pending or self._rows or self._swaps or self._closing):
                    self._cv.wait()
                if self._closing:
                    break
                swap = self._swaps[0] if self._swaps else None
                admit = [] if swap is not None else self._take_pending()
            if swap is not None and not self._rows:
                self._apply_swap(swap)
                continue
            try:
                with torch.inference_mode():
                    self._step(admit)
            except Exception as exc:
                log.exception("engine_step_failed", rows=len(self._rows), admitted=len(admit))
                self._fail_all(admit, f"generation failed: {type(exc).__name__}: {exc}")
        self._shutdown()

    def _take_pending(self) -> list[_Seq]:
        admit: list[_Seq] = []
        budget = self.max_num_batched_tokens
        room = self.max_num_seqs - len(self._rows)
        while self._pending and len(admit) < room:
            seq = self._pending[0]
            if seq.cancelled:
                self._pending.popleft()
                self._finish_cancelled(seq)
                continue
            if admit and len(seq.prompt_ids) > budget:
                break
            budget -= len(seq.prompt_ids)
            admit.append(self._pending.popleft())
        return admit

    def _step(self, admit: list[_Seq]) -> None:
        self._drop_cancelled()
        if admit:
            self._prefill(admit)
        if not self._rows:
            return
        assert self._logits is not None and self._positions is not None
        tokens, logprobs, tops = self._sample(self._logits, self._rows)
        self.stats.steps += 1
        self.stats.generated_tokens += len(self._rows)
        self.stats.max_batch_size = max(self.stats.max_batch_size, len(self._rows))
        self.stats.batch_sizes.append(len(self._rows))
        keep: list[int] = []
        for i, seq in enumerate(self._rows):
            self._emit(seq, tokens[i], logprobs[i], tops[i] if tops is not None else None)
            if not seq.finished:
                keep.append(i)
        if not keep:
            self._reset()
            return
        fed = torch.tensor([tokens[i] for i in keep], device=self.device).unsqueeze(1)
        self._select(keep)
        assert self._mask is not None and self._positions is not None and self._kv is not None
        ones = torch.ones((len(keep), 1), dtype=self._mask.dtype, device=self.device)
        self._mask = torch.cat([self._mask, ones], dim=1)
        logits, self._kv = hf_compat.forward(
            self.model, fed, self._mask, self._positions.unsqueeze(1), self._kv, last_only=True
        )
        self._logits = logits.float()
        self._positions = self._positions + 1
        self._trim()

    def _prefill(self, seqs: list[_Seq]) -> None:
        lengths = [len(s.prompt_ids) for s in seqs]
        width = max(lengths)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, width - lengths[i] :] = torch.tensor(s.prompt_ids)
            mask[i, width - lengths[i] :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        position_ids = (mask.cumsum(-1) - 1).clamp_min(0)
        logits, kv = hf_compat.forward(self.model, ids, mask, position_ids, None, last_only=True)
        assert kv is not None
        # Padding never contributes (masked), but keep it finite: 0 * NaN would poison attention.
        pad = (mask == 0)[:, None, :, None]
        kv = [(k.masked_fill(pad, 0), v.masked_fill(pad, 0)) for k, v in kv]
        positions = torch.tensor(lengths, device=self.device)
        self.stats.prefills += 1
        self.stats.admitted += len(seqs)
        self._merge(seqs, kv, mask, positions, logits.float())

    def _merge(
        self,
        seqs: list[_Seq],
        kv: hf_compat.KV,
        mask: torch.Tensor,
        positions: torch.Tensor,
        logits: torch.Tensor,
    ) -> None:
        if self._kv is None or not self._rows:
            self._rows, self._kv, self._mask, self._positions, self._logits = (
                list(seqs),
                kv,
                mask,
                positions,
                logits,
            )
            return
        assert self._mask is not None and self._positions is not None and self._logits is not None
        width = max(self._mask.shape[1], mask.shape[1])
        merged: hf_compat.KV = []
        for (k0, v0), (k1, v1) in zip(self._kv, kv, strict=True):
            merged.append(
                (
                    torch.cat([_left_pad(k0, width, 2), _left_pad(k1, width, 2)], dim=0),
                    torch.cat([_left_pad(v0, width, 2), _left_pad(v1, width, 2)], dim=0),
                )
            )
        self._kv = merged
        self._mask = torch.cat([_left_pad(self._mask, width, 1), _left_pad(mask, width, 1)], dim=0)
        self._positions = torch.cat([self._positions, positions])
        self._logits = torch.cat([self._logits, logits])
        self._rows = self._rows + list(seqs)

    def _select(self, keep: list[int]) -> None:
        assert self._kv is not None and self._mask is not None and self._positions is not None
        if len(keep) == len(self._rows):
            return
        index = torch.tensor(keep, device=self.device)
        self._kv = [(k.index_select(0, index), v.index_select(0, index)) for k, v in self._kv]
        self._mask = self._mask.index_select(0, index)
        self._positions = self._positions.index_select(0, index)
        if self._logits is not None:
            self._logits = self._logits.index_select(0, index)
        self._rows = [self._rows[i] for i in keep]

    def _trim(self) -> None:
        """Drop leading cache columns that are padding in every row."""
        assert self._mask is not None and self._kv is not None
        used = self._mask.any(dim=0)
        first = int(used.float().argmax().item())
        if first > 0:
            self._mask = self._mask[:, first:]
            self._kv = [(k[:, :, first:], v[:, :, first:]) for k, v in self._kv]

    def _drop_cancelled(self) -> None:
        if not any(s.cancelled for s in self._rows):
            return
        keep = []
        for i, s in enumerate(self._rows):
            if s.cancelled:
                self._finish_cancelled(s)
            else:
                keep.append(i)
        if keep:
            self._select(keep)
        else:
            self._reset()

    def _reset(self) -> None:
        self._rows, self._kv, self._mask, self._positions, self._logits = [], None, None, None, None

    def _sample(
        self, logits: torch.Tensor, rows: list[_Seq]
    ) -> tuple[list[int], list[float], list[list[tuple[int, float]]] | None]:
        temps = [r.params.temperature for r in rows]
        scale = torch.tensor([t if t > 0 else 1.0 for t in temps], device=logits.device)
        scaled = logits / scale.unsqueeze(1)
        logprobs = torch.log_softmax(scaled, dim=-1)
        greedy = torch.tensor([t == 0 for t in temps], device=logits.device)
        chosen = scaled.argmax(dim=-1)
        if not bool(greedy.all()):
            filtered = _truncate(scaled, rows)
            # Inverse-CDF sampling: one uniform per row from the row's own stream; ~25x cheaper
            # than exponential/Gumbel noise over the whole vocabulary.
            cdf = torch.softmax(filtered, dim=-1).cumsum(dim=-1)
            uniforms = _uniforms([r.key for r in rows], [len(r.out_ids) for r in rows])
            u = torch.from_numpy(uniforms).to(device=logits.device, dtype=cdf.dtype).unsqueeze(1)
            # Scaled by the total (rounding) and kept above 0, so a zero-probability token never wins.
            u = (u * cdf[:, -1:]).clamp_min(torch.finfo(cdf.dtype).tiny)
            sampled = torch.searchsorted(cdf, u).squeeze(1).clamp_max(cdf.shape[-1] - 1)
            chosen = torch.where(greedy, chosen, sampled)
        token_lp = logprobs.gather(1, chosen.unsqueeze(1)).squeeze(1)
        k = max(r.params.top_logprobs for r in rows)
        tops: list[list[tuple[int, float]]] | None = None
        if k > 0:
            values, indices = logprobs.topk(k, dim=-1)
            v_list, i_list = values.tolist(), indices.tolist()
            tops = [
                list(zip(i_list[j][: r.params.top_logprobs], v_list[j][: r.params.top_logprobs], strict=True))
                for j, r in enumerate(rows)
            ]
        return chosen.tolist(), token_lp.tolist(), tops

    def _emit(self, seq: _Seq, token: int, logprob: float, top: list[tuple[int, float]] | None) -> None:
        p = seq.params
        seq.out_ids.append(token)
        finish: str | None = None
        stop_reason: str | int | None = None
        is_stop_token = False
        if not p.ignore_eos and token in self.eos_ids:
            finish, is_stop_token = "stop", True
        elif token in p.stop_token_ids:
            finish, stop_reason, is_stop_token = "stop", token, True
        delta: str | None = None
        if seq.detok is not None:
            if not is_stop_token:
                seq.detok.add(token)
            if finish is None and p.stop:
                hit = _find_stop(seq.detok.text, p.stop, seq.emitted)
                if hit is not None:
                    idx, stop = hit
                    end = idx + len(stop) if p.include_stop_str_in_output else idx
                    seq.detok.text = seq.detok.text[:end]
                    finish, stop_reason = "stop", stop
        if finish is None and len(seq.out_ids) >= p.max_tokens:
            finish = "length"
        if finish is None and len(seq.prompt_ids) + len(seq.out_ids) >= self.max_model_len:
            finish = "length"
        if seq.detok is not None:
            text = seq.detok.text
            hold = 0 if finish is not None else max((len(s) for s in p.stop), default=1) - 1
            end = max(seq.emitted, len(text) - hold)
            delta = text[seq.emitted : end]
            seq.emitted = end
        if finish is not None:
            seq.finished = True
        seq.sink(StepOutput(token, logprob, top, delta, finish, stop_reason, version=self._version))

    def _finish_cancelled(self, seq: _Seq) -> None:
        if not seq.finished:
            seq.finished = True
            seq.sink(StepOutput(-1, 0.0, finish_reason="abort", version=self._version))

    def _fail_all(self, admitted: list[_Seq], message: str) -> None:
        for seq in [*self._rows, *admitted]:
            if not seq.finished:
                seq.finished = True
                seq.sink(StepOutput(-1, 0.0, finish_reason="abort", error=message, version=self._version))
        self._reset()

    def _apply_swap(self, swap: _Swap) -> None:
        try:
            state = swap.weights.state_dict() if isinstance(swap.weights, torch.nn.Module) else swap.weights
            if swap.partial:
                unknown = sorted(set(state) - set(self.model.state_dict()))
                if unknown:  # checked before anything is copied: a failed swap changes nothing
                    raise KeyError(f"not tensors of the served model: {unknown[:3]}")
            with torch.no_grad():
                self.model.load_state_dict(state, strict=not swap.partial)
            self._version = swap.version if swap.version is not None else self._version + 1
            swap.result = self._version
            log.info("weights_published", version=self._version)
        except Exception as exc:
            swap.error = exc
            log.exception("weight_swap_failed")
        with self._cv:
            self._swaps.popleft()
        swap.done.set()

    def _shutdown(self) -> None:
        with self._cv:
            pending = list(self._pending)
            self._pending.clear()
            swaps = list(self._swaps)
            self._swaps.clear()
        self._fail_all(pending, "the engine is shut down")
        for swap in swaps:
            swap.error = EngineError("the engine is shut down")
            swap.done.set()

    def _result(self, prompt: Sequence[int], outs: list[StepOutput]) -> SequenceResult:
        last = outs[-1]
        if last.error is not None:
            raise EngineError(last.error)
        real = [o for o in outs if o.token_id >= 0]
        ids = [o.token_id for o in real]
        detokenized = any(o.text_delta is not None for o in outs)
        text = (
            "".join(o.text_delta or "" for o in outs)
            if detokenized
            else self.decode_output(ids, last.finish_reason, last.stop_reason)
        )
        return SequenceResult(
            prompt_ids=list(prompt),
            token_ids=ids,
            logprobs=[o.logprob for o in real],
            top_logprobs=[o.top_logprobs or [] for o in real],
            text=text,
            finish_reason=last.finish_reason or "abort",
            stop_reason=last.stop_reason,
            version=last.version,
        )

    def decode_output(self, ids: list[int], finish_reason: str | None, stop_reason: str | int | None) -> str:
        """Text of a finished output when it was not detokenized incrementally (no stop strings)."""
        if ids and finish_reason == "stop" and (stop_reason is None or isinstance(stop_reason, int)):
            if ids[-1] in self.eos_ids or ids[-1] == stop_reason:
                ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _pad_id(self) -> int:
        for candidate in (
            getattr(self.tokenizer, "pad_token_id", None),
            getattr(self.model.config, "pad_token_id", None),
            getattr(self.tokenizer, "eos_token_id", None),
        ):
            if isinstance(candidate, int):
                return candidate
        return 0

    def _eos_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        for source in (
            getattr(self.tokenizer, "eos_token_id", None),
            getattr(getattr(self.model, "generation_config", None), "eos_token_id", None),
        ):
            if isinstance(source, int):
                ids.add(source)
            elif isinstance(source, list | tuple):
                ids.update(int(t) for t in source)
        return frozenset(ids)


def _threadsafe_put(
    loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[tuple[int, StepOutput]], index: int
) -> Callable[[StepOutput], None]:
    def put(out: StepOutput) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening
            loop.call_soon_threadsafe(queue.put_nowait, (index, out))

    return put


def _left_pad(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    missing = width - t.shape[dim]
    if missing == 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)


def _truncate(scaled: torch.Tensor, rows: list[_Seq]) -> torch.Tensor:
    """Top-k / top-p filtering per row (rows without either are left as they are)."""
    top_ps = [r.params.top_p for r in rows]
    top_ks = [r.params.top_k for r in rows]
    out = scaled
    if any(k > 0 for k in top_ks):
        vocab = scaled.shape[-1]
        ks = torch.tensor([min(k, vocab) if k > 0 else vocab for k in top_ks], device=scaled.device)
        sorted_vals = scaled.sort(dim=-1, descending=True).values
        kth = sorted_vals.gather(1, (ks - 1).unsqueeze(1))
        out = out.masked_fill(out < kth, float("-inf"))
    if any(p < 1.0 for p in top_ps):
        ps = torch.tensor(top_ps, device=scaled.device, dtype=scaled.dtype).unsqueeze(1)
        sorted_vals, sorted_idx = out.sort(dim=-1, descending=True)
        probs = torch.softmax(sorted_vals, dim=-1)
        before = probs.cumsum(dim=-1) - probs  # mass strictly above each token
        remove_sorted = before >= ps
        remove_sorted[:, 0] = False  # always keep the most likely token
        remove = torch.zeros_like(remove_sorted).scatter(1, sorted_idx, remove_sorted)
        out = out.masked_fill(remove, float("-inf"))
    return out


def _find_stop(text: str, stops: tuple[str, ...], emitted: int) -> tuple[int, str] | None:
    """Earliest stop string in the not-yet-emitted part of `text` (a stop may start earlier)."""
    best: tuple[int, str] | None = None
    for stop in stops:
        idx = text.find(stop, max(0, emitted - len(stop) + 1))
        if idx >= 0 and (best is None or idx < best[0]):
            best = (idx, stop)
    return best
