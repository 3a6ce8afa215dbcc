"""No silent no-ops: every key of a training config is read by the chosen backend, or start-up fails.

A backend declares the keys it reads (`read`); `compat` are keys it accepts without reading
them, each with the reason said in the warning (v1.0 compatibility: a v1.0 config is a verl
config, and its engine keys — parallelism, memory, placement — say how verl runs, not what it
computes). Any other key fails start-up with a `ConfigError` naming the key and the backend,
with the closest key it does read when one is close ("did you mean").
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import fields, is_dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from agentlightning.log import get_logger
from agentlightning.trainer.config import ConfigError

log = get_logger("config_keys")


def dataclass_keys(prefix: str, cls: type, skip: Collection[str] = ()) -> tuple[set[str], set[str]]:
    """(leaf keys, mapping keys) a dataclass schema declares, dotted under `prefix`. A mapping key
    (a dict-valued field) holds user-chosen names below it (e.g. `env_map`)."""
    leaves: set[str] = set()
    maps: set[str] = set()
    for f in fields(cls):
        key = f"{prefix}{f.name}"
        if key in skip:
            continue
        default = f.default_factory() if callable(f.default_factory) else f.default
        if is_dataclass(default):
            more, more_maps = dataclass_keys(f"{key}.", type(default), skip)
            leaves |= more
            maps |= more_maps
        elif isinstance(default, dict):
            maps.add(key)
        else:
            leaves.add(key)
    return leaves, maps


def leaf_items(cfg: Any, prefix: str = "", maps: Collection[str] = ()) -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every leaf of a nested mapping; a key in `maps` is one leaf."""
    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_container(cfg, resolve=False)
    if not isinstance(cfg, Mapping):
        return
    for key, value in cfg.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value and path not in maps:
            yield from leaf_items(value, f"{path}.", maps)
        else:
            yield path, value


def did_you_mean(key: str, known: Collection[str]) -> str:
    parent = key.rpartition(".")[0]
    siblings = [k for k in known if k.rpartition(".")[0] == parent]
    close = difflib.get_close_matches(key, siblings, n=1, cutoff=0.75) or difflib.get_close_matches(
        key, list(known), n=1, cutoff=0.85
    )
    return f" (did you mean {close[0]}?)" if close else ""


def check_keys(
    cfg: DictConfig | Mapping[str, Any],
    backend: str,
    read: Collection[str],
    maps: Collection[str] = (),
    compat: Callable[[str, Any], str | None] | None = None,
) -> dict[str, str]:
    """Fail on any key the backend neither reads nor accepts; return the accepted-unread keys
    (`key -> reason`), which are logged once as a warning."""
    unknown: list[str] = []
    accepted: dict[str, str] = {}
    for key, value in leaf_items(cfg, maps=maps):
        if key in read or any(key.startswith(f"{m}.") or key == m for m in maps):
            continue
        reason = compat(key, value) if compat is not None else None
        if reason is not None:
            accepted[key] = reason
        else:
            unknown.append(key)
    if unknown:
        first = unknown[0]
        more = f"; also not read: {', '.join(unknown[1:])}" if len(unknown) > 1 else ""
        raise ConfigError(
            f"{first}: not a key the {backend} backend reads{did_you_mean(first, read)}{more}. "
            "Every key must do something: remove it or fix its name (docs/training.md#configuration)"
        )
    if accepted:
        log.warning(f"config_keys_not_read_by_{backend}_backend", keys=accepted)
    return accepted
