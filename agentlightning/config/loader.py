"""What every command line shares (agl-server, agl-controller, agl-train, agl-demo).

Its config: the packaged defaults, an optional `--config FILE.yaml`, then dotted `key=value`
overrides (`load_cli_config`; `config_args` for an entry point that composes its own defaults).
Its logging (`setup_logging`). How it stops: Ctrl-C and SIGTERM raise KeyboardInterrupt and are
remembered (`catch_interrupts`, `interrupted`), and a run they stop exits 130 (`exit_on_interrupt`).
Bad arguments or a bad config exit 2 with a message that names the problem (`fail`).
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from agentlightning.config.suggest import not_a_key
from agentlightning.log import configure_logging

USAGE = """usage: {prog} [--config FILE.yaml] [key=value ...]

Keys use dots for nesting (store.url=memory://). Defaults:

{defaults}"""


def load_cli_config(
    config_name: str, argv: Sequence[str], prog: str, strict: bool = True, free_maps: Sequence[str] = ()
) -> DictConfig:
    """Compose `agentlightning/config/{config_name}.yaml` with a user file and overrides.

    `strict`: a key the packaged file does not have is an error. Without it, new keys are
    accepted (the training config: one file may carry keys only the verl backend reads; each
    backend checks its own sections). `free_maps`: mappings whose keys are the user's (an agent's
    environment variables): one given by the user replaces the default instead of merging into it.
    Prints usage and exits on -h/--help; exits 2 with a message on a bad argument.
    """
    if "-h" in argv or "--help" in argv:
        print(USAGE.format(prog=prog, defaults=OmegaConf.to_yaml(_compose(config_name, []))))
        raise SystemExit(0)
    user_file, overrides = config_args(argv, prog)
    base = _compose(config_name, [])
    try:
        user = [OmegaConf.load(user_file)] if user_file is not None else []
        user.append(OmegaConf.from_dotlist(overrides))
        for key in free_maps:
            if any(OmegaConf.select(layer, key) is not None for layer in user):
                OmegaConf.update(base, key, {}, merge=False)
            OmegaConf.set_struct(OmegaConf.select(base, key), False)
        OmegaConf.set_struct(base, strict)
        return merge(base, *user)
    except (OmegaConfBaseException, ValueError) as exc:
        fail(prog, f"bad config: {config_error(exc, leaf_keys(base), prog)}")


def leaf_keys(cfg: DictConfig) -> set[str]:
    """The dotted keys of a config's leaves (and of its empty mappings)."""
    out: set[str] = set()

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        else:
            out.add(prefix[:-1])

    walk(OmegaConf.to_container(cfg, resolve=False), "")
    return out


def config_error(exc: Exception, known: Collection[str] = (), prog: str = "") -> str:
    """OmegaConf's error as one line that names the key: an unknown key with the closest known
    one ("did you mean"), a value of the wrong type with what was expected."""
    key = getattr(exc, "full_key", None)
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if not key:
        return first
    if isinstance(exc, ConfigKeyError) and "not in struct" in first:
        listed = f"; `{prog} --help` lists every key" if prog else ""
        return f"{not_a_key(key, known)}{listed}"
    return f"{key}: {first}"


def merge(base: DictConfig, *others: Any) -> DictConfig:
    """`OmegaConf.merge` typed as what it gives onto a mapping: a DictConfig."""
    merged = OmegaConf.merge(base, *others)
    if not isinstance(merged, DictConfig):  # cannot happen: merging onto a DictConfig keeps its type
        raise TypeError(f"merging onto a mapping gave a {type(merged).__name__}")
    return merged


def config_args(argv: Sequence[str], prog: str) -> tuple[Path | None, list[str]]:
    """The `--config FILE` and the `key=value` overrides of a command line; exits 2 naming a bad
    argument. `key=` means the empty string, not null."""
    args = list(argv)
    user_file: Path | None = None
    if "--config" in args:
        i = args.index("--config")
        if i + 1 >= len(args):
            fail(prog, "--config needs a file")
        user_file = Path(args[i + 1])
        del args[i : i + 2]
        if not user_file.is_file():
            fail(prog, f"config file {user_file} does not exist")
    bad = [a for a in args if "=" not in a or a.startswith("-")]
    if bad:
        fail(prog, f"arguments must be key=value overrides, got {bad[0]!r}")
    return user_file, [f"{a}''" if a.endswith("=") else a for a in args]


def setup_logging(prog: str, level: str, section: str = "") -> None:
    """structlog at `level`; a bad level exits 2 naming its key (`{section}log_level`)."""
    try:
        configure_logging(level)
    except ValueError as exc:  # "log_level must be one of …"
        fail(prog, f"bad config: {section}{exc}")


_SIGNALS: list[int] = []  # the signals received: kept even where a KeyboardInterrupt gets swallowed


def _interrupt(signum: int, frame: FrameType | None) -> None:
    _SIGNALS.append(signum)
    raise KeyboardInterrupt(f"signal {signum}")


def catch_interrupts() -> None:
    """Ctrl-C (SIGINT) and SIGTERM (a supervisor's stop) raise KeyboardInterrupt, so the `finally`
    blocks that stop what the run started run. SIGINT is installed explicitly: a process started
    by a non-interactive shell's background job (`make test &`, many CI runners) inherits it
    ignored, and Python then installs no handler — Ctrl-C would be ignored and the run go on."""
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)


def interrupted() -> bool:
    """A signal caught by `catch_interrupts` came (whatever became of its KeyboardInterrupt)."""
    return bool(_SIGNALS)


@contextmanager
def exit_on_interrupt(
    prog: str, message: str = "stopped", cleanup: Callable[[], None] | None = None
) -> Iterator[None]:
    """A run stopped by Ctrl-C or SIGTERM inside exits 130 with `{prog}: {message}` after
    `cleanup()` — also when the interrupt was swallowed and the block ended normally."""
    try:
        yield
    except KeyboardInterrupt:
        pass
    else:
        if not interrupted():
            return
    if cleanup is not None:
        cleanup()
    fail(prog, message, 130)


def _compose(config_name: str, overrides: list[str]) -> DictConfig:
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="agentlightning.config", version_base=None):
        return compose(config_name=config_name, overrides=overrides)


def fail(prog: str, message: str, code: int = 2) -> NoReturn:
    """Exit with `code` after `{prog}: {message}` on stderr."""
    print(f"{prog}: {message}", file=sys.stderr)
    raise SystemExit(code)
