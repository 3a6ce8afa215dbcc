"""`agl train CONFIG`: train on one machine with nothing else running, or against a running Gateway.

    agl train my_agent/config.yaml [key=value ...]

When the config names no Gateway (`agentlightning.agl_base_url`, in the file or on the command
line), it starts the embedded default beside the trainer: a local Gateway (SQLite under the run's
output folder, a fresh key) and a local Controller whose agents run in the config file's folder
(so `agent_class: agent:MyAgent` is `agent.py` beside `config.yaml`). It prints the dashboard's
URL, trains, and stops what it started, also on Ctrl-C and SIGTERM. Given a Gateway it is
`agl-train` (`backend=verl` included): the Gateway and its Controller are the user's.

Paths written in the file (data files, output folder, hooks) are relative to the file's folder;
paths on the command line are relative to the current directory.
"""

from __future__ import annotations

import secrets
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from agentlightning.commands.backends import BACKENDS
from agentlightning.commands.backends import main as agl_train  # torch, or verl by backend=
from agentlightning.config.loader import catch_interrupts, config_args, fail, load_cli_config, merge
from agentlightning.launch import Service, start_controller, start_gateway

PROG = "agl train"
GATEWAY_KEY = "agentlightning.agl_base_url"
# Keys whose value, written in the config file, is a path relative to that file's folder.
FILE_PATHS = ("data.train_files", "data.val_files", "trainer.output_dir", "agentlightning.hooks")
EFFECTIVE_CONFIG = "agl-train.yaml"  # the file with its paths made absolute, in the output folder

USAGE = f"""usage: agl train CONFIG.yaml [backend=torch|verl] [--check] [key=value ...]

Without a Gateway in the config ({GATEWAY_KEY}), starts a local Gateway and Controller for the
run and stops them at its end; with one, trains against it (= agl-train). Paths in CONFIG are
relative to its folder. --check reads the config as the backend will and exits: 0 when it is
good, 2 naming the bad key (it starts nothing). Every key with its default follows (as
`agl-train --help` prints them; docs/training.md says what each does); a starter: `agl init DIR`."""


def split_args(argv: Sequence[str]) -> tuple[Path | None, list[str], list[str]]:
    """(config file, `backend=` arguments, `key=value` overrides) of the command line."""
    args = list(argv)
    positional = [a for a in args if "=" not in a and not a.startswith("-")]
    if "--config" in args:
        i = args.index("--config")
        positional = [a for a in positional if a != (args[i + 1] if i + 1 < len(args) else None)]
    if len(positional) > 1:
        fail(PROG, f"one config file, got {positional}")
    if positional:
        if "--config" in args:
            fail(PROG, f"a config file twice: {positional[0]} and --config")
        args.remove(positional[0])
        args[:0] = ["--config", positional[0]]
    backend = [a for a in args if a.startswith("backend=")]
    user_file, overrides = config_args([a for a in args if not a.startswith("backend=")], PROG)
    return user_file, backend, overrides


def _absolute(value: Any, folder: Path) -> Any:
    if isinstance(value, str) and value and not value.startswith("${") and "://" not in value:
        return str(folder / value) if not Path(value).is_absolute() else value
    if isinstance(value, (list, ListConfig)):
        return [_absolute(v, folder) for v in value]
    return value


def load_user_file(path: Path) -> DictConfig:
    """The config file, its relative paths made relative to its folder."""
    try:
        user = OmegaConf.load(path)
    except (OmegaConfBaseException, ValueError, OSError) as exc:
        fail(PROG, f"bad config: {path}: {exc}")
    if not isinstance(user, DictConfig):
        fail(PROG, f"bad config: {path} holds a list, not a mapping of settings")
    folder = path.resolve().parent
    for key in FILE_PATHS:
        value = OmegaConf.select(user, key, default=None)
        if value is not None:
            OmegaConf.update(user, key, _absolute(value, folder), force_add=True)
    return user


def names_gateway(user: DictConfig | None, overrides: Sequence[str]) -> bool:
    in_file = user is not None and OmegaConf.select(user, GATEWAY_KEY, default=None) not in (None, "")
    return in_file or any(o.startswith(f"{GATEWAY_KEY}=") for o in overrides)


class LocalServices:
    """The embedded default: a Gateway and a Controller for one run, stopped by `stop()`."""

    def __init__(self, cfg: DictConfig, agents_dir: Path) -> None:
        self.cfg = cfg
        self.agents_dir = agents_dir
        self.out = Path(str(cfg.trainer.output_dir)).resolve()
        self.key = str(cfg.agentlightning.agl_key or "") or secrets.token_urlsafe(16)
        self.started: list[Service] = []

    def start(self) -> str:
        """Start both; the Gateway's URL."""
        self.out.mkdir(parents=True, exist_ok=True)
        rollout = self.cfg.actor_rollout_ref.rollout
        gateway = start_gateway(
            f"default_proxy.model_name={self.cfg.agentlightning.model_name}",
            f"default_proxy.train.temperature={float(rollout.temperature)}",
            key=self.key,
            store_url=f"sqlite:///{self.out / 'gateway.db'}",
            log_level="warning",
            log_path=self.out / "gateway.log",
            name="gateway",
            ready_timeout=None,  # waited for below, after the trainer's imports (they take as long)
        )
        self.started.append(gateway)
        import agentlightning.torch_backend.trainer  # noqa: F401  # torch and transformers, meanwhile

        gateway.wait_http_ok(f"{gateway.url}/healthz", timeout=180)  # a busy machine imports slowly
        controller = start_controller(
            gateway.url,
            f"local_runner.cwd={self.agents_dir}",
            runner_type="local",
            key=self.key,
            log_dir=self.out / "agents",
            log_level="warning",
            log_path=self.out / "controller.log",
            name="controller",
            ready_timeout=180,
        )
        self.started.append(controller)
        say(
            f"{PROG}: Gateway     {gateway.url} (pid {gateway.pid}, SQLite {self.out / 'gateway.db'}, "
            f"log {gateway.log_path})\n"
            f"{PROG}: Dashboard   {gateway.url}/ui/#key={self.key}\n"
            f"{PROG}: Controller  pid {controller.pid}, local runner, agents run in {self.agents_dir}, "
            f"their logs in {self.out / 'agents'}"
        )
        return gateway.url

    def stop(self) -> None:
        for service in reversed(self.started):  # the Controller (and its agents), then the Gateway
            service.stop()
        if self.started:
            pids = ", ".join(str(s.pid) for s in self.started)
            say(f"{PROG}: stopped the Gateway and the Controller (pids {pids})")
        self.started = []


def check_torch_config(cfg: DictConfig) -> None:
    """The torch backend's reading of the whole config (every key read, every value valid);
    exits 2 naming the bad key. The verl backend checks its keys at its own start."""
    from agentlightning.torch_backend.config import load_torch_backend_config
    from agentlightning.trainer.config import load_training_config

    try:
        load_training_config(cfg)
        load_torch_backend_config(cfg)
    except ValueError as exc:  # ConfigError names the key
        fail(PROG, f"bad config: {exc}")


def check_verl_config(user: DictConfig | None, overrides: Sequence[str]) -> None:
    """The verl backend's reading of the config (ours, then verl's own `validate_config`), the same
    composition `agl-train backend=verl` makes; exits 2 naming the bad key, or saying to install
    verl where it is missing."""
    try:
        from agentlightning.verl.version import check_verl_version

        check_verl_version()
    except ImportError as exc:  # VerlVersionError says which verl and how to install it
        fail(f"{PROG} backend=verl", str(exc))
    from agentlightning.config.schema import ConfigError
    from agentlightning.verl.config import compose_config, validate

    try:
        validate(compose_config(user, overrides))
    except (ConfigError, OmegaConfBaseException, ValueError) as exc:
        fail(PROG, f"bad config: {exc}")


def say(line: str) -> None:
    print(line, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "-h" in args or "--help" in args:
        from agentlightning.torch_backend.cli import help_text  # what agl-train --help prints: every key

        print(f"{USAGE}\n\n{help_text().split(chr(10) * 2, 1)[1]}")  # without agl-train's usage line
        return 0
    check_only = "--check" in args
    user_file, backend, overrides = split_args([a for a in args if a != "--check"])
    user = load_user_file(user_file) if user_file is not None else None
    base = load_cli_config("train", [], prog=PROG, strict=False)
    try:
        cfg = merge(base, *([user] if user is not None else []), OmegaConf.from_dotlist(overrides))
        out = Path(str(cfg.trainer.output_dir)).resolve()
    except (OmegaConfBaseException, ValueError) as exc:
        fail(PROG, f"bad config: {exc}")
    backend_name = (backend or ["backend=torch"])[-1].partition("=")[2]
    if backend_name not in BACKENDS:
        fail(PROG, f"backend must be {' or '.join(BACKENDS)}, got {backend_name!r}")
    if backend_name == "verl":  # a misspelt key fails now, not after the services started
        check_verl_config(user, overrides)
    else:
        check_torch_config(cfg)
    if check_only:
        say(f"{PROG}: {user_file or 'the defaults'}: good for the {backend_name} backend")
        return 0
    if user is not None:  # the file as the trainer reads it: its paths made absolute
        out.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(user, out / EFFECTIVE_CONFIG)
        backend = [*backend, "--config", str(out / EFFECTIVE_CONFIG)]
    if names_gateway(user, overrides):
        agl_train([*backend, *overrides])
        return 0
    services = LocalServices(cfg, user_file.resolve().parent if user_file is not None else Path.cwd())
    catch_interrupts()  # Ctrl-C or SIGTERM while the services start stops them too
    try:
        url = services.start()
        agl_train([*backend, *overrides, f"{GATEWAY_KEY}={url}", f"agentlightning.agl_key={services.key}"])
        return 0
    except KeyboardInterrupt:
        fail(PROG, "interrupted; every process it started is stopped", 130)
    finally:
        # A second Ctrl-C must not cut the stopping short (each service is SIGKILLed after a grace)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        services.stop()
