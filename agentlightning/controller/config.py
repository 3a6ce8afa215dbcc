"""Typed controller configuration, read as every component reads its own (`config/schema.py`): a
wrong type, an unknown key (with a did-you-mean) or a bad value fails at start-up naming the key."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from omegaconf import DictConfig, OmegaConf

from agentlightning.config.schema import ConfigError, fill

RUNNER_TYPES = ("local", "k8s")


@dataclass
class AglServerConfig:
    url: str = "http://127.0.0.1:8080"
    agent_url: str = ""
    key: str = ""
    request_timeout: float = 30.0


@dataclass
class LocalRunnerConfig:
    maximum_size: int = 50
    poll_interval: float = 1.0
    warm_start: bool = True
    warm_pool_size: int = 4
    preload_timeout: float = 120.0
    preload_retry_seconds: float = 60.0
    python: str = ""
    cwd: str = ""
    log_dir: str = ".agl/controller/logs"
    keep_logs: int = 1000
    keep_failed_logs: int = 10000
    kill_grace_seconds: float = 2.0
    error_tail_lines: int = 20


@dataclass
class K8sRunnerConfig:
    namespace: str = "default"
    ttl_after_finished: int = 1200
    max_jobs_per_minute: int = 100
    poll_interval: float = 5.0
    max_active_jobs: int = 0
    kubeconfig: str = ""
    context: str = ""
    stuck_pod_seconds: float = 30.0
    deadline_slack_seconds: float = 30.0
    delete_jobs_on_shutdown: bool = False
    error_tail_lines: int = 20


@dataclass
class ControllerConfig:
    runner_type: str = "local"
    log_level: str = "info"
    max_attempts: int = 1
    long_poll_seconds: float = 30.0
    resync_interval: float = 10.0
    shutdown_timeout: float = 15.0
    metrics_port: int = -1  # GET /metrics for Prometheus on this port; -1: off, 0: any free port
    metrics_host: str = "127.0.0.1"
    conventional_env: bool = True  # also OPENAI_BASE_URL/_API_KEY, ANTHROPIC_BASE_URL/_API_KEY/_AUTH_TOKEN
    agl_server: AglServerConfig = field(default_factory=AglServerConfig)
    local_runner: LocalRunnerConfig = field(default_factory=LocalRunnerConfig)
    k8s_runner: K8sRunnerConfig = field(default_factory=K8sRunnerConfig)

    @property
    def poll_interval(self) -> float:
        """The active runner's poll interval (v1.0 keeps one per runner)."""
        return self.k8s_runner.poll_interval if self.runner_type == "k8s" else self.local_runner.poll_interval


def _check_url(key: str, value: str) -> None:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"{key} must be an http(s) URL such as http://127.0.0.1:8080, got {value!r}")


def _validate(c: ControllerConfig) -> None:
    checks: list[tuple[bool, str]] = [
        (c.runner_type in RUNNER_TYPES, f"runner_type must be one of {', '.join(RUNNER_TYPES)}"),
        (c.max_attempts >= 1, "max_attempts must be at least 1"),
        (c.long_poll_seconds >= 0, "long_poll_seconds must be >= 0"),
        (c.resync_interval > 0, "resync_interval must be > 0"),
        (c.shutdown_timeout >= 0, "shutdown_timeout must be >= 0"),
        (-1 <= c.metrics_port < 65536, "metrics_port must be -1 (off), 0 (any free port) or a port"),
        (c.agl_server.request_timeout > 0, "agl_server.request_timeout must be > 0"),
        (c.local_runner.maximum_size >= 1, "local_runner.maximum_size must be at least 1"),
        (c.local_runner.poll_interval > 0, "local_runner.poll_interval must be > 0"),
        (c.local_runner.warm_pool_size >= 1, "local_runner.warm_pool_size must be at least 1"),
        (c.local_runner.preload_timeout > 0, "local_runner.preload_timeout must be > 0"),
        (c.local_runner.preload_retry_seconds >= 0, "local_runner.preload_retry_seconds must be >= 0"),
        (c.local_runner.kill_grace_seconds >= 0, "local_runner.kill_grace_seconds must be >= 0"),
        (c.local_runner.error_tail_lines >= 0, "local_runner.error_tail_lines must be >= 0"),
        (bool(c.local_runner.log_dir), "local_runner.log_dir must not be empty"),
        (c.local_runner.keep_logs >= -1, "local_runner.keep_logs must be >= 0, or -1 to keep all"),
        (
            c.local_runner.keep_failed_logs >= -1,
            "local_runner.keep_failed_logs must be >= 0, or -1 to keep all",
        ),
        (bool(c.k8s_runner.namespace), "k8s_runner.namespace must not be empty"),
        (c.k8s_runner.ttl_after_finished >= -1, "k8s_runner.ttl_after_finished must be >= -1"),
        (c.k8s_runner.max_jobs_per_minute >= 0, "k8s_runner.max_jobs_per_minute must be >= 0"),
        (c.k8s_runner.poll_interval > 0, "k8s_runner.poll_interval must be > 0"),
        (c.k8s_runner.max_active_jobs >= 0, "k8s_runner.max_active_jobs must be >= 0"),
        (c.k8s_runner.stuck_pod_seconds >= 0, "k8s_runner.stuck_pod_seconds must be >= 0"),
        (c.k8s_runner.deadline_slack_seconds >= 0, "k8s_runner.deadline_slack_seconds must be >= 0"),
        (c.k8s_runner.error_tail_lines >= 0, "k8s_runner.error_tail_lines must be >= 0"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
    _check_url("agl_server.url", c.agl_server.url)
    if c.agl_server.agent_url:
        _check_url("agl_server.agent_url", c.agl_server.agent_url)


def load_controller_config(
    cfg: DictConfig | dict[str, Any] | None = None, **overrides: Any
) -> ControllerConfig:
    """Validate a (partial) config against the schema and return it as a typed object; a
    `ConfigError` names the key of whatever is wrong."""
    config: ControllerConfig = fill(ControllerConfig, OmegaConf.merge(cfg or {}, overrides))
    _validate(config)
    return config
