"""Typed Gateway configuration. A wrong type or unknown key fails at start-up naming the key."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf


@dataclass
class ModeConfig:
    temperature: float = 1.0


@dataclass
class DefaultProxyConfig:
    model_name: str = "policy"
    include_log_probs: bool = True
    train: ModeConfig = field(default_factory=lambda: ModeConfig(temperature=1.0))
    val: ModeConfig = field(default_factory=lambda: ModeConfig(temperature=0.0))


@dataclass
class StoreConfig:
    url: str = "sqlite:///.agl/gateway.db"
    synchronous: str = "normal"
    read_threads: int = 4


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8181
    key: str = ""
    log_level: str = "info"
    max_body_bytes: int = 64 * 1024 * 1024
    long_poll_max_seconds: float = 60.0
    default_proxy: DefaultProxyConfig = field(default_factory=DefaultProxyConfig)
    store: StoreConfig = field(default_factory=StoreConfig)


def load_server_config(cfg: DictConfig | dict[str, Any] | None = None, **overrides: Any) -> ServerConfig:
    """Validate a (partial) config against the schema and return it as a typed object."""
    schema = OmegaConf.structured(ServerConfig)
    merged = OmegaConf.merge(schema, cfg or {}, overrides)
    config: ServerConfig = OmegaConf.to_object(merged)  # type: ignore[assignment]
    if config.max_body_bytes <= 0:
        raise ValueError(f"max_body_bytes must be positive, got {config.max_body_bytes}")
    if not 0 < config.port < 65536 and config.port != 0:
        raise ValueError(f"port must be 0..65535, got {config.port}")
    return config
