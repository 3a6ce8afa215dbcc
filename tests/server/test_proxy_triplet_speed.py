"""The triplet view's faster token-id checks and prompt keys behave exactly as before."""

from __future__ import annotations

import hashlib
import random

from agentlightning.server.triplet import _int_list, model_request_triplet, prompt_key


def test_prompt_key_is_the_blake2b_of_the_uint32_ids_else_of_repr() -> None:
    rng = random.Random(0)
    for n in (1, 2, 50, 4000):
        ids = [rng.randrange(0, 200_000) for _ in range(n)]
        raw = b"".join(i.to_bytes(4, "little") for i in ids)
        assert prompt_key(ids) == hashlib.blake2b(raw, digest_size=16).hexdigest()
        beyond = [*ids, rng.choice([-1, 2**32, 2**40])]
        assert prompt_key(beyond) == hashlib.blake2b(repr(beyond).encode(), digest_size=16).hexdigest()


def test_int_list_accepts_plain_ints_only() -> None:
    assert _int_list([]) == []
    assert _int_list([1, 2, 3]) == [1, 2, 3]
    for bad in ([1, True], [1, 2.0], [1, "2"], [None], "123", None, {"a": 1}):
        assert _int_list(bad) is None, bad


def test_bad_token_ids_give_an_empty_triplet() -> None:
    triplet = model_request_triplet(
        {"response": {"prompt_token_ids": [1, False], "choices": [{"token_ids": [3, 4.5]}]}}
    )
    assert triplet["prompt_token_ids"] == [] and triplet["response_token_ids"] == []
