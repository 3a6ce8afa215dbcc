"""The packed wire formats: the encode and the decode of each, in one place.

* Token ids as uint32 and log-probs as float64, little-endian bytes: how the Gateway's delta
  storage keeps a model call (server/store/delta.py) and what the `triplet_delta` view sends,
  base64 inside JSON.
* `triplet_delta`, the collection format of the batch events route: a model call's triplet with
  `prompt_ref: [i, n] | null` (the first n prompt ids of the event at index i of the same
  answer; null: none) and `prompt_suffix` (the ids after them) instead of `prompt_token_ids`,
  and its id lists and log-probs as base64 of uint32 / float64. The Gateway writes it
  (`encode_triplet_delta`); the trainer reads it back into the `triplet` view
  (`expand_prompt_refs`), optionally keeping a referred prompt lazy (`PromptIds`).

This module is a base layer beside `schemas`: it imports nothing of the server, the client or
the trainer, so each of them can use it.
"""

from __future__ import annotations

import array
import base64
import sys
from collections.abc import Iterator, Sequence
from typing import Any, TypeAlias, overload

from agentlightning.model_call import CallTokens, CallTriplet

_LITTLE = sys.byteorder == "little"


# --- uint32 ids and float64 log-probs as little-endian bytes ---------------------------------------


def _little_endian(a: array.array[Any]) -> array.array[Any]:
    if not _LITTLE:  # pragma: no cover
        a.byteswap()
    return a


def ids_to_bytes(ids: Sequence[int]) -> bytes | None:
    """uint32 little-endian; None when an id does not fit (then the call is stored plainly)."""
    try:
        a = array.array("I", ids)
    except (OverflowError, TypeError):
        return None
    if a.itemsize != 4:  # pragma: no cover - every platform we run on has a 4-byte unsigned int
        return None
    return _little_endian(a).tobytes()


def bytes_to_ids(raw: bytes | memoryview) -> list[int]:
    a = array.array("I")
    a.frombytes(raw)
    return _little_endian(a).tolist()


def floats_to_bytes(values: Sequence[float]) -> bytes:
    return _little_endian(array.array("d", values)).tobytes()


def bytes_to_floats(raw: bytes | memoryview) -> list[float]:
    a = array.array("d")
    a.frombytes(raw)
    return _little_endian(a).tolist()


# --- triplet_delta: encode (the Gateway) --------------------------------------------------------


def _b64(raw: bytes | memoryview) -> bytes:
    return b'"' + base64.b64encode(raw) + b'"'


def encode_triplet_delta(
    ref: tuple[int, int] | None,
    suffix: bytes | memoryview,
    response: bytes | memoryview,
    log_probs: bytes | memoryview | None,
    tail: bytes,
) -> bytes:
    """A model call's `data` in the `triplet_delta` format, as JSON.

    `ref`: `(i, n)`, the prompt begins with the first n prompt ids of the answer's event i
    (None: it does not refer); `suffix`: the prompt's ids after those (uint32 bytes);
    `response` (uint32) and `log_probs` (float64, None: not reported) as `ids_to_bytes` and
    `floats_to_bytes` give them; `tail`: the triplet's other fields as a JSON object (`{}`)."""
    return (
        b'{"prompt_ref":'
        + (b"null" if ref is None else b"[%d,%d]" % ref)
        + b',"prompt_suffix":'
        + _b64(suffix)
        + b',"response_token_ids":'
        + _b64(response)
        + b',"response_log_probs":'
        + (_b64(log_probs) if log_probs is not None else b"null")
        + (b"," + tail[1:] if len(tail) > 2 else b"}")
    )


# --- triplet_delta: decode (the trainer) --------------------------------------------------------


class PromptIds(Sequence[int]):
    """Prompt ids given by reference: the first `shared` ids of `base`, then `suffix`.

    Kept lazily, so that a rollout's calls cost memory in proportion to their new ids; the
    whole list is built when asked for (`whole()`, iteration, a slice reaching into the shared
    part). Trajectory aggregation uses `base` to skip comparing the shared prefix."""

    __slots__ = ("base", "shared", "suffix")

    def __init__(self, base: Sequence[int], shared: int, suffix: list[int]) -> None:
        self.base = base
        self.shared = shared
        self.suffix = suffix

    def __len__(self) -> int:
        return self.shared + len(self.suffix)

    def whole(self) -> list[int]:
        pieces = [self.suffix]
        base, n = self.base, self.shared
        while isinstance(base, PromptIds):  # the chain of references, without recursion
            if n > base.shared:
                pieces.append(base.suffix[: n - base.shared])
                n = base.shared
            base = base.base
        out = list(base[:n])
        for piece in reversed(pieces):
            out += piece
        return out

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step == 1 and start >= self.shared:
                return self.suffix[start - self.shared : max(stop - self.shared, 0)]
            return self.whole()[index]
        if index >= self.shared:
            return self.suffix[index - self.shared]
        return self.whole()[index]

    def __iter__(self) -> Iterator[int]:
        return iter(self.whole())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PromptIds):
            other = other.whole()
        return self.whole() == other if isinstance(other, list) else NotImplemented

    __hash__ = None  # type: ignore[assignment]  # a mutable sequence, like the list it stands for

    def __repr__(self) -> str:
        return f"PromptIds({self.whole()!r})"


# A model call's triplet as the trainer reads it: from `format=triplet` (plain lists), or back from
# `triplet_delta` by `expand_prompt_refs` (with `lazy`, a prompt given by reference is a PromptIds).
CollectedTriplet: TypeAlias = CallTriplet[list[int] | PromptIds]


def _u32(packed: str) -> list[int]:
    return bytes_to_ids(base64.b64decode(packed))


def _f64(packed: str) -> list[float]:
    return bytes_to_floats(base64.b64decode(packed))


def expand_prompt_refs(events: list[dict[str, Any]], lazy: bool = False) -> list[dict[str, Any]]:
    """The `triplet` view from a `triplet_delta` answer's events (in place, and returned).

    A call in the packed form — `prompt_ref: [i, n] | null`, `prompt_suffix`, and the id lists
    and log-probs as base64 of uint32 / float64 little-endian — gets `prompt_token_ids` = the
    first n prompt ids of event i, then the suffix; its lists decoded. With `lazy`, a prompt
    given by reference stays a `PromptIds` (memory in proportion to the new ids; trajectory
    aggregation reads it), else it is a plain list."""
    for j, event in enumerate(events):
        data = event.get("data")
        if not (isinstance(data, dict) and "prompt_suffix" in data):
            continue
        ref = data.pop("prompt_ref")
        suffix = _u32(data.pop("prompt_suffix"))
        prompt: list[int] | PromptIds
        if ref is None:
            prompt = suffix
        else:
            i, n = ref
            if not 0 <= i < j:
                raise ValueError(f"prompt_ref {i} of event {j} is not an earlier event of the answer")
            earlier: CollectedTriplet = events[i]["data"]
            prompt = PromptIds(earlier["prompt_token_ids"], n, suffix)
            if not lazy:
                prompt = prompt.whole()
        log_probs = data.pop("response_log_probs")
        tokens: CallTokens[list[int] | PromptIds] = {
            "prompt_token_ids": prompt,
            "response_token_ids": _u32(data.pop("response_token_ids")),
            "response_log_probs": _f64(log_probs) if log_probs is not None else None,
        }
        event["data"] = {**tokens, **data}  # the triplet view's key order: the lists, then the rest
    return events
