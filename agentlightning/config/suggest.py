""" "Did you mean": the closest known name to a misspelt dotted key (or command).

The first segment of the key that leads nowhere is the misspelt one: it is matched against the
names known at that level, so `agentlightning.locl.agent_class` suggests
`agentlightning.local.agent_class`, not whichever whole key happens to look most alike.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection


def closest(key: str, known: Collection[str]) -> str | None:
    """The known key `key` most likely meant, or None when none is close."""
    nodes = {".".join(k.split(".")[: i + 1]) for k in known for i in range(k.count(".") + 1)}
    parts = key.split(".")
    for i, part in enumerate(parts):
        here = ".".join(parts[: i + 1])
        if here in nodes:
            continue
        parent = ".".join(parts[:i])
        names = {
            n.split(".")[i] for n in nodes if n.count(".") == i and (not parent or n.startswith(f"{parent}."))
        }
        match = difflib.get_close_matches(part, sorted(names), n=1, cutoff=0.6)
        if match:
            fixed = ".".join([*parts[:i], match[0], *parts[i + 1 :]])
            if fixed in nodes:  # the rest of the key is right too
                return fixed
            return ".".join([*parts[:i], match[0]])
        break
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.85)
    return close[0] if close else None


def did_you_mean(key: str, known: Collection[str]) -> str:
    """` (did you mean X?)` for the closest known key, or "" when none is close."""
    match = closest(key, known)
    return f" (did you mean {match}?)" if match else ""


def not_a_key(full: str, known: Collection[str], label: str = "the config") -> str:
    """The one wording of an unknown key, for every component: `a.b: not a key of a (did you mean
    a.c?)`; a top-level key is not a key of `label`."""
    section = full.rpartition(".")[0] or label
    return f"{full}: not a key of {section}{did_you_mean(full, known)}"
