"""Model calls stored as deltas: a rollout's stored bytes grow with its unique tokens, not quadratically.

Every call of a multi-turn agent re-sends the whole conversation, so a `model_request` event
repeats all earlier prompt token ids and messages. Within one attempt, a call is stored as a
reference to an earlier call plus what is new:

* the call's tokens as a `wire.TokenDelta`, the codec the `triplet_delta` collection format
  sends too: the first `shared` prompt ids of call `ref`, then `suffix` (uint32 little-endian,
  4 bytes an id instead of ~7 as JSON text), the response ids (uint32) and the triplet's
  log-probs (float64: exact, 8 bytes instead of ~20 as JSON text) once, in binary, instead of
  in both the raw payload and the triplet view;
* the request's lists of messages: `(msg_base, msg_shared, new messages)` — the first
  `msg_shared` messages of call `msg_base`, then the new ones (each its own JSON text). Each
  list a call re-sends is its own delta: `request.messages` (chat, Anthropic), `request.input`
  (Responses: Codex CLI re-sends its whole history as items) and `chat_request.messages` (the
  chat form the proxy recorded for a Responses or Anthropic call).

The rest of the payload is kept as JSON with placeholders where those lists were; reads splice
them back, so every read route returns byte-for-byte the JSON a plain store returns.

Finding the call to refer to costs no scan of the rollout's history: per attempt, a small LRU
index keeps the last few calls' prompt digests (blake2b of the prefix at every `BLOCK` ids and
of the whole prompt) and message hashes. A new prompt is hashed once, in blocks; the earlier
call sharing the longest prefix is chosen (its whole prompt, or a whole number of blocks).
A call whose base is unknown (the index forgot it, the Gateway restarted) is stored whole.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from agentlightning.model_call import CallTokens, CallTriplet
from agentlightning.schemas import EVENT_MODEL_REQUEST
from agentlightning.server.store.base import EventRecord, StoredEvent
from agentlightning.server.triplet import keep_last_per_prompt
from agentlightning.wire import TokenDelta, bytes_to_ids, floats_to_bytes, ids_to_bytes

BLOCK = 1024  # prompt ids per digest block: a shared prefix is found to this granularity
# Calls with shorter prompts are stored whole: splitting costs more than it saves there (the
# proxy's per-call CPU), and a longer call extending one is stored whole once, then is a base.
MIN_PROMPT_IDS = 512
CANDIDATES = 4  # earlier calls per attempt an extension is looked for in (interleaved conversations)
INDEX_ATTEMPTS = 16384  # attempts the index keeps (LRU); ~2.5 KB each for 34k-token contexts

PH_PROMPT = "\x00agl:prompt_token_ids"
PH_RESPONSE = "\x00agl:token_ids"
PH_MESSAGES = "\x00agl:messages"
J_PROMPT = orjson.dumps(PH_PROMPT)
J_RESPONSE = orjson.dumps(PH_RESPONSE)
PH_MARK = b'"\\u0000agl:'  # how every placeholder's JSON begins

# Format 1 stored one list (`request.messages`) in the header's msg_base/msg_shared; format 2
# stores every list after the header; format 3 the tokens as the one `wire.TokenDelta` codec
# (formats 1 and 2 are still read).
FORMAT = 3
READS = (1, 2, 3)
F_PROMPT = 1  # the raw payload's prompt ids were taken out
F_MESSAGES = 2  # the raw payload's request messages were taken out
F_RESPONSE = 4  # the raw payload's first choice token ids were taken out
F_LOGPROBS = 8  # formats 1 and 2: the triplet has log-probs (format 3: in its TokenDelta)
F_INPUT = 16  # the raw payload's Responses `request.input` items were taken out
F_CHAT_MESSAGES = 32  # the raw payload's `chat_request.messages` were taken out


@dataclass(frozen=True)
class _Slot:
    """A list a call re-sends whole each time, taken out of the payload and stored as a delta."""

    key: str  # the payload's object holding the list
    field: str
    flag: int
    placeholder: bytes  # the placeholder's JSON


SLOTS = (
    _Slot("request", "messages", F_MESSAGES, orjson.dumps(PH_MESSAGES)),
    _Slot("request", "input", F_INPUT, orjson.dumps("\x00agl:input")),
    _Slot("chat_request", "messages", F_CHAT_MESSAGES, orjson.dumps("\x00agl:chat_messages")),
)
# Format 3: format, flags; per slot taken out, in SLOTS order, its _SLOT_HEADER; the call's
# TokenDelta (`ref`: an earlier call's sequence number); the slots' new items.
_HEADER = struct.Struct("<BB")
_SLOT_HEADER = struct.Struct("<qII")  # base call (0: none), items shared, new items' bytes
# Formats 1 and 2: format, flags, tok_base (0: none), tok_shared, msg_base, msg_shared (format 1
# only), the bytes of the suffix ids, response ids, log-probs; format 2: then the slot headers.
_HEADER_V2 = struct.Struct("<BBqIqIIII")
_TOKEN_KEYS = CallTokens.__required_keys__  # stored in binary; the triplet's other fields: its tail


# --- write side: splitting a call ---------------------------------------------------------------


@dataclass(slots=True)
class PromptDigests:
    """Digests of a prompt's prefixes: at every BLOCK ids, and of the whole."""

    length: int
    blocks: list[bytes]  # digest of the prefix of (k + 1) * BLOCK ids
    full: bytes
    states: list[Any] = field(default_factory=list)  # hasher state at k * BLOCK ids (k = 0, 1, …)

    @classmethod
    def of(cls, raw: bytes) -> PromptDigests:
        h = hashlib.blake2b(digest_size=16)
        view = memoryview(raw)
        step = BLOCK * 4
        states, blocks = [], []
        n_full = len(raw) // step
        for k in range(n_full):
            states.append(h.copy())
            h.update(view[k * step : (k + 1) * step])
            blocks.append(h.digest())
        states.append(h.copy())
        h.update(view[n_full * step :])
        return cls(len(raw) // 4, blocks, h.digest(), states)

    def digest_at(self, raw: bytes, n: int) -> bytes:
        """The digest of the first `n` ids (n <= length)."""
        k = n // BLOCK
        if n % BLOCK == 0 and k > 0:
            return self.blocks[k - 1]
        h = self.states[k].copy()
        h.update(memoryview(raw)[k * BLOCK * 4 : n * 4])
        digest: bytes = h.digest()
        return digest


@dataclass(slots=True)
class CallDraft:
    """A `model_request` event split for delta storage, before an earlier call is chosen as base.

    The record's `data` holds the payload with placeholders, its `triplet` the triplet's other
    fields (`server`, `http_status`, …) as a JSON object.
    """

    flags: int
    prompt: bytes  # uint32 ids of the triplet's prompt (empty: none)
    digests: PromptDigests | None
    lists: tuple[list[bytes] | None, ...]  # per slot: JSON of each item (None: not taken out)
    list_hashes: tuple[tuple[int, ...] | None, ...]
    response: bytes  # uint32 ids of the first choice
    log_probs: bytes | None  # float64 (None: not reported)
    # the originals, for rendering the event whole right after it was appended
    prompt_ids: list[int]
    response_ids: list[int]

    def full_data(self, residual: bytes) -> bytes:
        return _splice(residual, self.flags, self.prompt_ids, self.response_ids, list(self.lists))


def _splice(
    residual: bytes,
    flags: int,
    prompt: list[int],
    response: list[int],
    lists: list[list[bytes] | None],
) -> bytes:
    """The payload whole: each placeholder (once in `residual`) replaced by its value. By
    position, so that what a value's own text holds (a placeholder's text, say) never matters."""
    parts = []
    if flags & F_PROMPT:
        parts.append((J_PROMPT, orjson.dumps(prompt)))
    if flags & F_RESPONSE:
        parts.append((J_RESPONSE, orjson.dumps(response)))
    for slot, items in zip(SLOTS, lists, strict=True):
        if flags & slot.flag:
            parts.append((slot.placeholder, b"[" + b",".join(items or ()) + b"]"))
    out, at = [], 0
    for start, placeholder, value in sorted((residual.index(ph), ph, v) for ph, v in parts):
        out += [residual[at:start], value]
        at = start + len(placeholder)
    out.append(residual[at:])
    return b"".join(out)


def _render_triplet(prompt: list[int], tokens: TokenDelta, tail: bytes) -> bytes:
    """The triplet's JSON, as orjson writes it: the three lists first, then the tail's fields."""
    return (
        b'{"prompt_token_ids":'
        + orjson.dumps(prompt)
        + b',"response_token_ids":'
        + orjson.dumps(tokens.response_ids())
        + b',"response_log_probs":'
        + orjson.dumps(tokens.log_prob_values())
        + (b"," + tail[1:] if len(tail) > 2 else b"}")
    )


def split_call(
    data: Mapping[str, Any], triplet: CallTriplet[list[int]]
) -> tuple[bytes, bytes, CallDraft] | None:
    """`(payload with placeholders, triplet tail, draft)`, or None to store the call plainly
    (a short prompt, ids beyond uint32, a placeholder already in the payload). Raises
    orjson.JSONEncodeError.

    `triplet` is `model_request_triplet(data)`: its id lists are the payload's own list objects."""
    prompt_ids = triplet["prompt_token_ids"]
    if len(prompt_ids) < MIN_PROMPT_IDS:
        return None
    response_ids = triplet["response_token_ids"]
    log_probs = triplet["response_log_probs"]
    prompt = ids_to_bytes(prompt_ids)
    response = ids_to_bytes(response_ids)
    if prompt is None or response is None:
        return None
    flags = 0
    residual = dict(data)
    n_placeholders = 0
    resp = data.get("response")
    if isinstance(resp, dict):
        resp = dict(resp)
        choices = resp.get("choices")
        choice0 = (
            choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
        )
        if prompt_ids:  # where the triplet took them from: the top level (chat) or the first choice
            if resp.get("prompt_token_ids") is prompt_ids:
                resp["prompt_token_ids"] = PH_PROMPT
            else:
                assert choice0 is not None
                choice0 = {**choice0, "prompt_token_ids": PH_PROMPT}
            flags |= F_PROMPT
            n_placeholders += 1
        if choice0 is not None and choice0.get("token_ids") is response_ids:
            choice0 = {**choice0, "token_ids": PH_RESPONSE}
            flags |= F_RESPONSE
            n_placeholders += 1
        if choice0 is not None:
            resp["choices"] = [choice0, *choices[1:]]  # type: ignore[index]  # resp is a dict once choice0 is
        residual["response"] = resp
    lists: list[list[bytes] | None] = []
    for slot in SLOTS:
        holder = residual.get(slot.key)
        items = holder.get(slot.field) if isinstance(holder, dict) else None
        if not isinstance(items, list):
            lists.append(None)
            continue
        assert isinstance(holder, dict)
        lists.append([orjson.dumps(m) for m in items])
        residual[slot.key] = {**holder, slot.field: orjson.loads(slot.placeholder)}
        flags |= slot.flag
        n_placeholders += 1
    encoded = orjson.dumps(residual)
    if encoded.count(PH_MARK) != n_placeholders:
        return None  # the payload itself contains a placeholder's text
    tail = orjson.dumps({k: v for k, v in triplet.items() if k not in _TOKEN_KEYS})
    draft = CallDraft(
        flags=flags,
        prompt=prompt,
        digests=PromptDigests.of(prompt) if prompt else None,
        lists=tuple(lists),
        list_hashes=tuple(tuple(hash(m) for m in items) if items is not None else None for items in lists),
        response=response,
        log_probs=floats_to_bytes(log_probs) if log_probs is not None else None,
        prompt_ids=prompt_ids,
        response_ids=response_ids,
    )
    return encoded, tail, draft


def prompt_key_of(draft: CallDraft) -> str | None:
    """The triplet dedup key of a split call: its whole prompt's digest."""
    return draft.digests.full.hex() if draft.digests is not None else None


# --- write side: the per-attempt index ----------------------------------------------------------


@dataclass(slots=True)
class _Candidate:
    seq: int
    length: int  # prompt ids (0: none)
    blocks: list[bytes]
    full: bytes
    list_hashes: tuple[tuple[int, ...] | None, ...]  # per slot (None: the call has no such list)


@dataclass(slots=True)
class PendingCall:
    """What the index learns once the call's row is committed (`CallIndex.remember`)."""

    generation: int
    key: tuple[str, str]
    candidate: _Candidate


def _common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    if len(b) <= len(a) and a[: len(b)] == b:  # the usual case, compared in C
        return len(b)
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class CallIndex:
    """Per attempt, the last few calls' digests: which earlier call a new one extends.

    Only committed calls are remembered, and a rollout's entries are dropped when it is deleted;
    an append that raced a delete is not remembered (the generation changed), so a base is
    always a row that exists in the same attempt.
    """

    def __init__(self, max_attempts: int = INDEX_ATTEMPTS) -> None:
        self._max = max_attempts
        self._attempts: OrderedDict[tuple[str, str], list[_Candidate]] = OrderedDict()
        self._by_rollout: dict[str, set[str]] = {}
        self.generation = 0

    def __len__(self) -> int:
        return len(self._attempts)

    def encode(self, record: EventRecord, draft: CallDraft) -> tuple[EventRecord, PendingCall]:
        """The record to store — the call as a delta against the best earlier call — and what
        to remember once it is committed."""
        key = (record.rollout_id, record.attempt_id)
        candidates = self._attempts.get(key, ())
        tok_base = tok_shared = 0
        bases = [(0, 0)] * len(SLOTS)  # per slot: (base call, items shared)
        d = draft.digests
        for c in candidates:  # oldest first: a tie goes to the latest
            if d is not None and c.length:
                shared = 0
                if c.length <= d.length and d.digest_at(draft.prompt, c.length) == c.full:
                    shared = c.length
                else:
                    for mine, theirs in zip(d.blocks, c.blocks, strict=False):
                        if mine != theirs:
                            break
                        shared += BLOCK
                if shared and shared >= tok_shared:
                    tok_base, tok_shared = c.seq, shared
            for k, (new_items, old_items) in enumerate(zip(draft.list_hashes, c.list_hashes, strict=True)):
                if new_items is not None and old_items:
                    shared = _common_prefix(new_items, old_items)
                    if shared and shared >= bases[k][1]:
                        bases[k] = (c.seq, shared)
        suffix = draft.prompt[tok_shared * 4 :]
        slot_headers, slot_items = [], []
        for items, (base, shared) in zip(draft.lists, bases, strict=True):
            if items is not None:  # JSON text holds no raw newline: it separates the items
                new = b"\n".join(items[shared:])
                slot_headers.append(_SLOT_HEADER.pack(base, shared, len(new)))
                slot_items.append(new)
        tokens = TokenDelta(tok_base or None, tok_shared, suffix, draft.response, draft.log_probs)
        blob = b"".join((_HEADER.pack(FORMAT, draft.flags), *slot_headers, tokens.pack(), *slot_items))
        candidate = _Candidate(
            seq=0,
            length=d.length if d is not None else 0,
            blocks=d.blocks if d is not None else [],
            full=d.full if d is not None else b"",
            list_hashes=draft.list_hashes,
        )
        return _replace(record, record.data, record.triplet, blob), PendingCall(
            self.generation, key, candidate
        )

    def remember(self, pending: PendingCall, seq: int) -> None:
        if pending.generation != self.generation:
            return  # a rollout was deleted meanwhile: perhaps this one, with this row
        c = pending.candidate
        c.seq = seq
        key = pending.key
        entries = self._attempts.get(key)
        if entries is None:
            entries = self._attempts[key] = []
            self._by_rollout.setdefault(key[0], set()).add(key[1])
            if len(self._attempts) > self._max:
                (old_rid, old_aid), _ = self._attempts.popitem(last=False)
                aids = self._by_rollout.get(old_rid)
                if aids is not None:
                    aids.discard(old_aid)
                    if not aids:
                        del self._by_rollout[old_rid]
        else:
            self._attempts.move_to_end(key)
        # A retry of the same prompt replaces the earlier one; of calls without prompt ids
        # (failed ones) only the last is kept, so that they cannot push the others out.
        entries[:] = [e for e in entries if not (e.length == c.length and e.full == c.full)]
        entries.append(c)
        if len(entries) > CANDIDATES:
            del entries[0]

    def forget(self, rollout_id: str) -> None:
        """Before a rollout's delete is submitted: nothing of it may be referred to any more."""
        self.generation += 1
        for aid in self._by_rollout.pop(rollout_id, ()):
            self._attempts.pop((rollout_id, aid), None)


# --- read side ----------------------------------------------------------------------------------


@dataclass(slots=True)
class _SlotDelta:
    base: int  # the call whose first `shared` items come first (0: none)
    shared: int
    new: memoryview  # the new items' JSON, newline-separated


@dataclass(slots=True)
class _Decoded:
    flags: int
    tokens: TokenDelta  # `ref`: the call whose prompt this one's begins with
    slots: dict[int, _SlotDelta]  # by index in SLOTS, for the lists taken out


def _decode(blob: bytes) -> _Decoded:
    fmt, flags = _HEADER.unpack_from(blob)
    if fmt not in READS:
        raise RuntimeError(f"stored call in format {fmt}, this Gateway reads formats {READS}")
    if fmt < 3:
        return _decode_v2(blob)
    heads, at = _slot_heads(blob, flags, _HEADER.size)
    tokens, at = TokenDelta.unpack(blob, at)
    return _Decoded(flags, tokens, _slot_deltas(blob, heads, at))


def _decode_v2(blob: bytes) -> _Decoded:
    """A call stored in format 1 or 2."""
    fmt, flags, tok_base, tok_shared, msg_base, msg_shared, n_suffix, n_resp, n_lp = _HEADER_V2.unpack_from(
        blob
    )
    at = _HEADER_V2.size
    if fmt == 1:  # one list, `request.messages`, to the end
        heads = [(0, msg_base, msg_shared, -1)] if flags & F_MESSAGES else []
    else:
        heads, at = _slot_heads(blob, flags, at)
    view = memoryview(blob)
    suffix = view[at : at + n_suffix]
    response = view[at + n_suffix : at + n_suffix + n_resp]
    at += n_suffix + n_resp
    log_probs = view[at : at + n_lp] if flags & F_LOGPROBS else None
    tokens = TokenDelta(tok_base or None, tok_shared, suffix, response, log_probs)
    return _Decoded(flags, tokens, _slot_deltas(blob, heads, at + n_lp))


def _slot_heads(blob: bytes, flags: int, at: int) -> tuple[list[tuple[int, int, int, int]], int]:
    """The lists' (slot, base, shared, new bytes) headers at `at`, and where they end."""
    heads = []
    for k, slot in enumerate(SLOTS):
        if flags & slot.flag:
            heads.append((k, *_SLOT_HEADER.unpack_from(blob, at)))
            at += _SLOT_HEADER.size
    return heads, at


def _slot_deltas(blob: bytes, heads: list[tuple[int, int, int, int]], at: int) -> dict[int, _SlotDelta]:
    """The lists' new items, stored one after the other from `at` (new bytes -1: to the end)."""
    view = memoryview(blob)
    slots = {}
    for k, base, shared, n_new in heads:
        end = len(view) if n_new < 0 else at + n_new
        slots[k] = _SlotDelta(base, shared, view[at:end])
        at = end
    return slots


def bases_of(blob: bytes) -> set[int]:
    """The earlier calls a stored call refers to (its prompt's and its lists' bases), as the
    Postgres store checks them for every batch of calls it inserts."""
    d = _decode(blob)
    return {b for b in (d.tokens.ref, *(delta.base for delta in d.slots.values())) if b}


class _Calls:
    """The decoded calls of one read, and their prompts and messages rebuilt on demand."""

    def __init__(self) -> None:
        self.decoded: dict[int, _Decoded] = {}
        self._prompts: dict[int, list[int]] = {}
        self._lists: dict[tuple[int, int], list[bytes]] = {}  # (call, slot) -> its items

    def _base(self, seq: int, base: int) -> _Decoded:
        d = self.decoded.get(base)
        if d is None:
            raise RuntimeError(f"stored call {seq} refers to call {base}, which is not in its attempt")
        return d

    def prompt(self, seq: int) -> list[int]:
        """The whole prompt of call `seq` (memoized; the chain is walked without recursion)."""
        chain = []
        s = seq
        while s not in self._prompts:
            t = self.decoded[s].tokens
            chain.append(s)
            if t.ref is None:
                break
            self._base(s, t.ref)
            s = t.ref
        for s in reversed(chain):
            t = self.decoded[s].tokens
            head = self._prompts[t.ref][: t.shared] if t.ref is not None else []
            self._prompts[s] = head + bytes_to_ids(t.suffix)
        return self._prompts[seq]

    def items(self, seq: int, slot: int) -> list[bytes]:
        """The whole list `slot` of call `seq` (memoized; its chain walked without recursion)."""
        chain = []
        s = seq
        while (s, slot) not in self._lists:
            delta = self._slot(s, slot)
            chain.append((s, delta))
            if not delta.base:
                break
            self._base(s, delta.base)
            s = delta.base
        for s, delta in reversed(chain):
            head = self._lists[(delta.base, slot)][: delta.shared] if delta.base else []
            new = bytes(delta.new).split(b"\n") if len(delta.new) else []
            self._lists[(s, slot)] = head + new
        return self._lists[(seq, slot)]

    def _slot(self, seq: int, slot: int) -> _SlotDelta:
        delta = self.decoded[seq].slots.get(slot)
        if delta is None:
            raise RuntimeError(f"stored call {seq} has no {SLOTS[slot].key}.{SLOTS[slot].field} to refer to")
        return delta


View = Literal["data", "triplet", "triplet_delta"]


def materialize(events: list[StoredEvent], view: View) -> list[StoredEvent]:
    """Whole events from stored ones (one rollout's, in order): calls stored as deltas get their
    payloads back.

    `data`: the raw payload; `triplet`: the triplet view; `triplet_delta` (the collection
    format, agentlightning/wire.py): the triplet view already de-duplicated (of calls with
    identical prompts only the last), each call stored as a delta given as a prompt reference
    into the answer and packed lists. Calls stored whole keep the `triplet` form.
    """
    stored = events
    if view == "triplet_delta":
        keys = [e.record.prompt_key if e.record.event_type == EVENT_MODEL_REQUEST else None for e in events]
        events = [events[i] for i in keep_last_per_prompt(keys)]
    if not any(e.record.call is not None for e in stored):
        return events
    calls = _Calls()
    for e in stored:  # those left out too: a kept call's prompt may refer to one
        if isinstance(e.record.call, bytes):
            calls.decoded[e.sequence] = _decode(e.record.call)
    position = {e.sequence: i for i, e in enumerate(events)}
    out = []
    for e in events:
        r = e.record
        d = calls.decoded.get(e.sequence)
        if d is None:
            out.append(e)
            continue
        if view == "data":
            response = d.tokens.response_ids() if d.flags & F_RESPONSE else []
            prompt = calls.prompt(e.sequence) if d.flags & F_PROMPT else []
            lists = [calls.items(e.sequence, k) if k in d.slots else None for k in range(len(SLOTS))]
            payload = _splice(r.data, d.flags, prompt, response, lists)
            out.append(StoredEvent(e.sequence, _replace(r, data=payload, triplet=None)))
            continue
        assert r.triplet is not None
        if view == "triplet":
            payload = _render_triplet(calls.prompt(e.sequence), d.tokens, r.triplet)
        else:
            payload = _render_packed(calls, e.sequence, d.tokens, position).to_json(r.triplet)
        out.append(StoredEvent(e.sequence, _replace(r, data=b"", triplet=payload)))
    return out


def _render_packed(calls: _Calls, seq: int, tokens: TokenDelta, position: dict[int, int]) -> TokenDelta:
    """A call's tokens for the `triplet_delta` format: its reference made against the nearest
    ancestor in the answer, by position (None: none there)."""
    shared, base = tokens.shared, tokens.ref
    while base is not None and base not in position:  # its base was left out (an earlier retry)
        b = calls.decoded[base].tokens
        shared = min(shared, b.shared)
        base = b.ref
    ref: int | None
    if base is None or not shared:  # the whole prompt
        ref, shared = None, 0
        suffix = tokens.suffix if tokens.ref is None else ids_to_bytes(calls.prompt(seq))
    else:
        ref = position[base]
        suffix = tokens.suffix if base == tokens.ref else ids_to_bytes(calls.prompt(seq)[shared:])
    assert suffix is not None  # ids that were stored as uint32 fit uint32
    return TokenDelta(ref, shared, suffix, tokens.response, tokens.log_probs)


def _replace(r: EventRecord, data: bytes, triplet: bytes | None, call: bytes | None = None) -> EventRecord:
    # Not dataclasses.replace: this runs for every call appended and read, and a constructor
    # call is a fraction of its cost.
    return EventRecord(
        r.rollout_id, r.attempt_id, r.event_type, r.timestamp, data, triplet, r.prompt_key, call
    )
