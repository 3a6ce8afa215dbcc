"""The environment of one agent: the `AGL_*` variables, the rollout's `env_map`, and (an option,
on by default) the same URLs and key under the names harnesses read unchanged."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import orjson

from agentlightning.schemas import Rollout

AGL_OPENAI_BASE_URL = "AGL_OPENAI_BASE_URL"
AGL_EVENT_URL = "AGL_EVENT_URL"
AGL_KEY = "AGL_KEY"
AGL_ANTHROPIC_BASE_URL = "AGL_ANTHROPIC_BASE_URL"
RESERVED = frozenset({AGL_OPENAI_BASE_URL, AGL_EVENT_URL, AGL_KEY, AGL_ANTHROPIC_BASE_URL})
# An SDK refuses an empty key; with the Gateway's auth off any value passes.
NO_KEY = "agl-no-key"
PATH_ROOTS = ("input", "metadata", "rollout_id", "is_train")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class EnvMapError(ValueError):
    """An env_map entry cannot be resolved; the message names the entry and the path."""


def agl_env(gateway_url: str, key: str, rollout_id: str, attempt_id: str, is_train: bool) -> dict[str, str]:
    """The agent contract of DESIGN.md § Wire compatibility."""
    base = gateway_url.rstrip("/")
    rid, aid = quote(rollout_id, safe=""), quote(attempt_id, safe="")
    mode = "train" if is_train else "val"
    root = f"{base}/proxy/rollout/{rid}/attempt/{aid}/mode/{mode}"
    return {
        AGL_OPENAI_BASE_URL: f"{root}/openai/v1",
        AGL_ANTHROPIC_BASE_URL: f"{root}/anthropic",  # the Anthropic SDKs append /v1/messages
        AGL_EVENT_URL: f"{base}/api/rollouts/{rid}/attempt/{aid}/events",
        AGL_KEY: key,
    }


def conventional_env(agl: Mapping[str, str]) -> dict[str, str]:
    """The agent's base URLs and scoped key under the names the OpenAI and Anthropic SDKs (and
    harnesses built on them: Codex CLI, Claude Code, ...) read unchanged."""
    key = agl[AGL_KEY] or NO_KEY
    return {
        "OPENAI_BASE_URL": agl[AGL_OPENAI_BASE_URL],
        "OPENAI_API_KEY": key,
        "ANTHROPIC_BASE_URL": agl[AGL_ANTHROPIC_BASE_URL],
        "ANTHROPIC_API_KEY": key,
        "ANTHROPIC_AUTH_TOKEN": key,
    }


def _as_env_value(value: Any) -> str:
    """Strings as they are, everything else as JSON (numbers, booleans, null, lists, objects)."""
    if isinstance(value, str):
        return value
    return orjson.dumps(value).decode()


def resolve_path(document: Mapping[str, Any], path: str) -> Any:
    """Follow `input.a.b.0` through dicts (by key) and lists (by index). Raises KeyError with the reason."""
    parts = path.split(".")
    if parts[0] not in PATH_ROOTS:
        raise KeyError(f"path {path!r} must start with one of {', '.join(PATH_ROOTS)}")
    value: Any = document
    walked: list[str] = []
    for part in parts:
        where = ".".join(walked) or "the rollout"
        if isinstance(value, Mapping):
            if part not in value:
                keys = ", ".join(sorted(map(str, value))[:20]) or "none"
                raise KeyError(f"path {path!r}: {where} has no key {part!r} (keys: {keys})")
            value = value[part]
        elif isinstance(value, list):
            if not part.isdigit():
                raise KeyError(f"path {path!r}: {where} is a list, {part!r} is not an index")
            if int(part) >= len(value):
                raise KeyError(f"path {path!r}: index {part} is out of range, {where} has {len(value)} items")
            value = value[int(part)]
        else:
            kind = "null" if value is None else f"of type {type(value).__name__}"
            raise KeyError(f"path {path!r}: {where} is {kind}, it has no {part!r}")
        walked.append(part)
    return value


def env_map_values(rollout: Rollout, env_map: Mapping[str, str]) -> dict[str, str]:
    """Resolve every `NAME: path` of a rollout's env_map. Raises EnvMapError naming the failed entry."""
    document = {
        "input": rollout.input,
        "metadata": rollout.metadata.model_dump(mode="json"),
        "rollout_id": rollout.rollout_id,
        "is_train": rollout.is_train,
    }
    env: dict[str, str] = {}
    for name, path in env_map.items():
        if not _ENV_NAME.match(name):
            raise EnvMapError(f"env_map: {name!r} is not a valid environment variable name")
        if name in RESERVED:
            raise EnvMapError(f"env_map: {name} is set by the controller and cannot be mapped")
        try:
            value = _as_env_value(resolve_path(document, str(path)))
        except KeyError as exc:
            raise EnvMapError(f"env_map {name}: {exc.args[0]}") from None
        if "\x00" in value:
            raise EnvMapError(f"env_map {name}: the value of {path!r} contains a NUL character")
        env[name] = value
    return env


def agent_env(
    rollout: Rollout,
    attempt_id: str,
    gateway_url: str,
    key: str,
    base: Mapping[str, str] | None = None,
    conventional: bool = True,
) -> dict[str, str]:
    """The full environment of one agent: `base` (e.g. the controller's own), the conventional
    names (when on), env_map (it may set those names itself), then AGL_*."""
    env = dict(base or {})
    agl = agl_env(gateway_url, key, rollout.rollout_id, attempt_id, rollout.is_train)
    if conventional:
        env.update(conventional_env(agl))
    if rollout.config.local is not None:
        env.update(env_map_values(rollout, rollout.config.local.env_map))
    env.update(agl)
    return env
