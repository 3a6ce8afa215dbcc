"""A config section's schema is a dataclass; this fills it, and every failure names its key.

The one way every component reads its settings (Gateway, Controller, trainer, backends, the
commands): `fill` builds the dataclass from plain values and fails on a key it does not declare
(with the closest declared one: "did you mean") or on a value of the wrong type; the dataclass's
own checks then fail on a bad value. Every failure is a `ConfigError` whose message starts with
the dotted key. `split_known`, `dataclass_keys` and `leaf_items` are the pieces the trainer's
many-backend key check (`trainer/config.py::check_keys`) builds on.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from dataclasses import fields, is_dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from agentlightning.config.suggest import not_a_key


class ConfigError(ValueError):
    """A bad setting. The message names the key and what is wrong with it."""


def plain(cfg: Any) -> Any:
    """A DictConfig as plain containers (interpolations resolved); anything else as it is."""
    return OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg


def fill(schema: type, values: Any, name: str = "", label: str = "the config") -> Any:
    """The `schema` dataclass filled from `values` (a mapping, or None for the defaults), under the
    dotted prefix `name` (`label`: what to call the top level in a message, e.g. `agl-sft`): a key
    the schema does not declare fails with a did-you-mean, a value of the wrong type fails naming
    the key."""
    values = {} if values is None else plain(values)
    if not isinstance(values, Mapping):
        raise ConfigError(f"{name or label} must be a mapping of settings, got {type(values).__name__}")
    picked, unknown = split_known(dict(values), schema)
    if unknown:
        raise unknown_key(name, unknown[0], schema, label)
    return build(schema, picked, name)


def unknown_key(name: str, key: str, schema: type, label: str = "the config") -> ConfigError:
    """The error for `key` (dotted, below `name`), which `schema` does not declare: it names the
    section the key is not in, and the closest key that is."""
    prefix = f"{name}." if name else ""
    known, _ = dataclass_keys(prefix, schema)
    return ConfigError(not_a_key(f"{prefix}{key}", known, label))


def build(schema: type, picked: Mapping[str, Any], name: str = "") -> Any:
    """`schema` from values it declares (see `split_known`); a wrong type fails naming the key."""
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), picked))
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or getattr(exc, "key", None) or "?"
        prefix = f"{name}." if name else ""
        raise ConfigError(f"{prefix}{key}: {str(exc).splitlines()[0]}") from None


def split_known(values: Any, schema: type, prefix: str = "") -> tuple[dict[str, Any], list[str]]:
    """The part of `values` that `schema` (a dataclass) declares, and the dotted keys it does not."""
    if not isinstance(values, dict):
        return {}, []
    declared = {f.name: f for f in fields(schema)}
    picked: dict[str, Any] = {}
    ignored: list[str] = []
    for key, value in values.items():
        f = declared.get(key)
        if f is None:
            ignored.append(f"{prefix}{key}")
            continue
        sub = _dataclass_type(f)
        if sub is not None and isinstance(value, dict):
            inner, more = split_known(value, sub, f"{prefix}{key}.")
            picked[key] = inner
            ignored += more
        else:
            picked[key] = value
    return picked, ignored


def _default(f: Any) -> Any:
    """A dataclass field's default value (built from its factory, if it has one)."""
    return f.default_factory() if callable(f.default_factory) else f.default


def _dataclass_type(f: Any) -> type | None:
    value = _default(f)
    return type(value) if is_dataclass(value) else None


def dataclass_keys(prefix: str, cls: type, skip: Collection[str] = ()) -> tuple[set[str], set[str]]:
    """(leaf keys, mapping keys) a dataclass schema declares, dotted under `prefix`. A mapping key
    (a dict-valued field) holds user-chosen names below it (e.g. `env_map`)."""
    leaves: set[str] = set()
    maps: set[str] = set()
    for f in fields(cls):
        key = f"{prefix}{f.name}"
        if key in skip:
            continue
        default = _default(f)
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
