"""Load an entry point's Hydra config: packaged defaults, an optional file, dotted overrides."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

USAGE = """usage: {prog} [--config FILE.yaml] [key=value ...]

Keys use dots for nesting (store.url=memory://). Defaults:

{defaults}"""


def load_cli_config(config_name: str, argv: Sequence[str], prog: str, strict: bool = True) -> DictConfig:
    """Compose `agentlightning/config/{config_name}.yaml` with a user file and overrides.

    `strict`: a key the packaged file does not have is an error. Without it, new keys are
    accepted (the training config: one file may carry keys only the verl backend reads; each
    backend checks its own sections). Prints usage and exits on -h/--help; exits 2 with a
    message on a bad argument.
    """
    args = list(argv)
    user_file: Path | None = None
    if "-h" in args or "--help" in args:
        print(USAGE.format(prog=prog, defaults=OmegaConf.to_yaml(_compose(config_name, []))))
        raise SystemExit(0)
    if "--config" in args:
        i = args.index("--config")
        if i + 1 >= len(args):
            _fail(prog, "--config needs a file")
        user_file = Path(args[i + 1])
        del args[i : i + 2]
        if not user_file.is_file():
            _fail(prog, f"config file {user_file} does not exist")
    bad = [a for a in args if "=" not in a or a.startswith("-")]
    if bad:
        _fail(prog, f"arguments must be key=value overrides, got {bad[0]!r}")
    # `key=` means the empty string, not null
    args = [f"{a}''" if a.endswith("=") else a for a in args]
    try:
        base: DictConfig | ListConfig = _compose(config_name, [])
        OmegaConf.set_struct(base, strict)
        if user_file is not None:
            base = OmegaConf.merge(base, OmegaConf.load(user_file))
        merged = OmegaConf.merge(base, OmegaConf.from_dotlist(args))
        assert isinstance(merged, DictConfig)  # a DictConfig merged with anything stays one
        return merged
    except (OmegaConfBaseException, ValueError) as exc:
        _fail(prog, f"bad config: {exc}")
        raise  # unreachable: _fail exits


def _compose(config_name: str, overrides: list[str]) -> DictConfig:
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="agentlightning.config", version_base=None):
        return compose(config_name=config_name, overrides=overrides)


def _fail(prog: str, message: str) -> None:
    print(f"{prog}: {message}", file=sys.stderr)
    raise SystemExit(2)
