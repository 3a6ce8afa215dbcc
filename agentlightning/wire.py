"""The packed wire formats: the encode and the decode of each, in one place.

* Token ids as uint32 and log-probs as float64, little-endian bytes.
* `TokenDelta`, a model call's token lists given against an earlier call's prompt: the one
  codec of the Gateway's delta storage (server/store/delta.py keeps `pack()`'s bytes) and of
  `triplet_delta`, the collection format of the batch events route (`to_json`): a model call's
  triplet with `prompt_ref: [i, n] | null` (the first n prompt ids of the event at index i of
  the same answer; null: none) and `prompt_suffix` (the ids after them) instead of
  `prompt_token_ids`, and its id lists and log-probs as base64 of uint32 / float64. The trainer
  reads it back into the `triplet` view (`expand_prompt_refs`), optionally keeping a referred
  prompt lazy (`PromptIds`).

This module is a base layer beside `schemas`: it imports nothing of the server, the client or
the trainer, so each of them can use it.
"""

from __future__ import annotations

import array
import base64
import struct
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
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


# --- a call's tokens as a delta: the one codec of the store and the collection format ----------


def _b64(raw: bytes | memoryview) -> bytes:
    return b'"' + base64.b64encode(raw) + b'"'


# ref (-1: none), shared, then the byte lengths of the suffix, the response and the log-probs (-1: None)
_DELTA_HEAD = struct.Struct("<qIIIi")


@dataclass(frozen=True, slots=True)
class TokenDelta:
    """A model call's token lists given against an earlier call: the prompt is the first
    `shared` prompt ids of the call `ref` names (None: no reference, `suffix` is the whole
    prompt), then `suffix`; the response's ids and log-probs packed.

    The Gateway's store (server/store/delta.py) keeps a call's tokens as `pack()` writes them,
    `ref` naming an earlier call of the attempt by sequence number; the `triplet_delta`
    collection format sends the same delta as JSON (`to_json`, `from_json`), `ref` naming an
    earlier event of the same answer by index. Ids are uint32 and log-probs float64,
    little-endian, as `ids_to_bytes` and `floats_to_bytes` write them (`log_probs` None: not
    reported)."""

    ref: int | None
    shared: int
    suffix: bytes | memoryview
    response: bytes | memoryview
    log_probs: bytes | memoryview | None

    def pack(self) -> bytes:
        lp = self.log_probs
        head = _DELTA_HEAD.pack(
            -1 if self.ref is None else self.ref,
            self.shared,
            len(self.suffix),
            len(self.response),
            -1 if lp is None else len(lp),
        )
        return b"".join((head, self.suffix, self.response, lp or b""))

    @classmethod
    def unpack(cls, buf: bytes | memoryview, at: int = 0) -> tuple[TokenDelta, int]:
        """The delta `pack()` wrote at `at` in `buf` (its lists are views into `buf`), and where it ends."""
        ref, shared, n_suffix, n_response, n_lp = _DELTA_HEAD.unpack_from(buf, at)
        view = memoryview(buf)
        at += _DELTA_HEAD.size
        suffix = view[at : at + n_suffix]
        at += n_suffix
        response = view[at : at + n_response]
        at += n_response
        log_probs = view[at : at + n_lp] if n_lp >= 0 else None
        at += max(n_lp, 0)
        return cls(ref if ref >= 0 else None, shared, suffix, response, log_probs), at

    def to_json(self, tail: bytes) -> bytes:
        """The call's `data` in the `triplet_delta` format: `prompt_ref: [ref, shared] | null`,
        then `prompt_suffix` and the response's lists, each base64 of its bytes, then `tail`'s
        fields (the triplet's others, as a JSON object)."""
        return (
            b'{"prompt_ref":'
            + (b"null" if self.ref is None else b"[%d,%d]" % (self.ref, self.shared))
            + b',"prompt_suffix":'
            + _b64(self.suffix)
            + b',"response_token_ids":'
            + _b64(self.response)
            + b',"response_log_probs":'
            + (_b64(self.log_probs) if self.log_probs is not None else b"null")
            + (b"," + tail[1:] if len(tail) > 2 else b"}")
        )

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TokenDelta:
        """The delta a `triplet_delta` call's `data` carries; its keys are taken out of `data`."""
        ref = data.pop("prompt_ref")
        log_probs = data.pop("response_log_probs")
        return cls(
            None if ref is None else ref[0],
            0 if ref is None else ref[1],
            base64.b64decode(data.pop("prompt_suffix")),
            base64.b64decode(data.pop("response_token_ids")),
            None if log_probs is None else base64.b64decode(log_probs),
        )

    def response_ids(self) -> list[int]:
        return bytes_to_ids(self.response)

    def log_prob_values(self) -> list[float] | None:
        return None if self.log_probs is None else bytes_to_floats(self.log_probs)


# --- triplet_delta, read back (the trainer) -----------------------------------------------------


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
        delta = TokenDelta.from_json(data)
        suffix = bytes_to_ids(delta.suffix)
        prompt: list[int] | PromptIds
        if delta.ref is None:
            prompt = suffix
        else:
            if not 0 <= delta.ref < j:
                raise ValueError(f"prompt_ref {delta.ref} of event {j} is not an earlier event of the answer")
            earlier: CollectedTriplet = events[delta.ref]["data"]
            prompt = PromptIds(earlier["prompt_token_ids"], delta.shared, suffix)
            if not lazy:
                prompt = prompt.whole()
        tokens: CallTokens[list[int] | PromptIds] = {
            "prompt_token_ids": prompt,
            "response_token_ids": delta.response_ids(),
            "response_log_probs": delta.log_prob_values(),
        }
        event["data"] = {**tokens, **data}  # the triplet view's key order: the lists, then the rest
    return events
