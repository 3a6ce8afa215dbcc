"""Typed Gateway configuration, read as every component reads its own (`config/schema.py`): a
wrong type, an unknown key (with a did-you-mean) or a bad value fails at start-up naming the key."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from agentlightning.config.schema import ConfigError, fill


@dataclass
class ModeConfig:
    temperature: float = 1.0


@dataclass
class DefaultProxyConfig:
    model_name: str = "policy"
    include_log_probs: bool = True
    include_routed_experts: bool = False  # MoE routing replay (R3): record vLLM's routed_experts
    token_exact: bool = True  # tokens in / tokens out where the upstream serves it (proxy/token_exact.py)
    train: ModeConfig = field(default_factory=lambda: ModeConfig(temperature=1.0))
    val: ModeConfig = field(default_factory=lambda: ModeConfig(temperature=0.7))


@dataclass
class StoreConfig:
    url: str = "sqlite:///.agl/gateway.db"
    synchronous: str = "normal"
    read_threads: int = 4
    wal_max_bytes: int = 64 * 1024 * 1024
    pool_size: int = 0  # postgresql:// only: connections per replica (0: 10)


@dataclass
class ProxyConfig:
    """How the model proxy talks to inference servers (see the `proxy:` block of server.yaml)."""

    connect_timeout_seconds: float = 10.0
    read_timeout_seconds: float = 600.0
    max_tries: int = 6
    backoff_seconds: float = 0.5
    max_backoff_seconds: float = 8.0
    jitter: float = 0.25
    max_connections: int = 0
    keepalive_seconds: float = 60.0
    upstream_key: str = ""
    # A token-path stream's new tokens are derendered and sent at most this often (the first at once).
    token_stream_interval_ms: float = 50.0
    # Chaos testing only: this share of model calls fail as if the model server answered 503 to every
    # try (proxy/faults.py); the same request sent again fails again.
    fault_rate: float = 0.0
    fault_seed: int = 0
    fault_modes: list[str] = field(default_factory=lambda: ["train", "val"])  # the calls it strikes

    def check(self) -> None:
        for name in (
            "connect_timeout_seconds",
            "read_timeout_seconds",
            "backoff_seconds",
            "max_backoff_seconds",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"proxy.{name} must be positive, got {getattr(self, name)}")
        if self.max_tries < 1:
            raise ConfigError(f"proxy.max_tries must be at least 1, got {self.max_tries}")
        if not 0 <= self.jitter < 1:
            raise ConfigError(f"proxy.jitter must be in [0, 1), got {self.jitter}")
        if self.max_connections < 0:
            raise ConfigError(
                f"proxy.max_connections must be 0 (unlimited) or positive, got {self.max_connections}"
            )
        if self.keepalive_seconds < 0:
            raise ConfigError(f"proxy.keepalive_seconds must be >= 0, got {self.keepalive_seconds}")
        if self.token_stream_interval_ms < 0:
            raise ConfigError(
                f"proxy.token_stream_interval_ms must be >= 0 (0: each read of the engine's stream), "
                f"got {self.token_stream_interval_ms}"
            )
        if not 0 <= self.fault_rate <= 1:
            raise ConfigError(f"proxy.fault_rate must be in [0, 1] (a share of calls), got {self.fault_rate}")
        unknown = sorted(set(self.fault_modes) - {"train", "val"})
        if unknown:
            raise ConfigError(f"proxy.fault_modes: unknown mode {unknown[0]!r}; the modes are train and val")
        if self.fault_rate > 0 and not self.fault_modes:
            raise ConfigError(
                "proxy.fault_modes is empty, so proxy.fault_rate strikes nothing: name train, val or both"
            )


@dataclass
class MetricsConfig:
    enabled: bool = True  # GET /metrics (Prometheus) and the dashboard's live rates


@dataclass
class TlsConfig:
    """HTTPS for agl-server: both files set, or neither (plain HTTP)."""

    certfile: str = ""  # PEM certificate (chain)
    keyfile: str = ""  # PEM private key

    def check(self) -> None:
        if bool(self.certfile) != bool(self.keyfile):
            raise ConfigError("tls.certfile and tls.keyfile must be set together (or neither)")
        for name in ("certfile", "keyfile"):
            path = getattr(self, name)
            if path and not Path(path).is_file():
                raise ConfigError(f"tls.{name}: no such file: {path}")

    @property
    def enabled(self) -> bool:
        return bool(self.certfile)


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    key: str = ""
    controller_key: str = ""
    token_secret: str = ""
    tls: TlsConfig = field(default_factory=TlsConfig)
    log_level: str = "info"
    max_body_bytes: int = 64 * 1024 * 1024
    long_poll_max_seconds: float = 60.0
    default_proxy: DefaultProxyConfig = field(default_factory=DefaultProxyConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    proxy: ProxyConfig = field(default_factory=ProxyConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)


def load_server_config(cfg: DictConfig | dict[str, Any] | None = None, **overrides: Any) -> ServerConfig:
    """Validate a (partial) config against the schema and return it as a typed object; a
    `ConfigError` names the key of whatever is wrong."""
    config: ServerConfig = fill(ServerConfig, OmegaConf.merge(cfg or {}, overrides))
    if config.max_body_bytes <= 0:
        raise ConfigError(f"max_body_bytes must be positive, got {config.max_body_bytes}")
    if config.store.wal_max_bytes <= 0:
        raise ConfigError(f"store.wal_max_bytes must be positive, got {config.store.wal_max_bytes}")
    if not 0 < config.port < 65536 and config.port != 0:
        raise ConfigError(f"port must be 0..65535, got {config.port}")
    config.proxy.check()
    config.tls.check()
    if config.controller_key and not config.key:
        raise ConfigError("controller_key needs key (the admin key) to be set too: without it auth is off")
    if config.controller_key and config.controller_key == config.key:
        raise ConfigError("controller_key must differ from key")
    return config
