"""The examples' training entry point: our base training config, the example's overrides, the
command line; then `agl-train` on that config with the chosen backend (the one training command:
its messages, exit codes and Ctrl-C/SIGTERM handling).

    python train_calc_agent.py --train-file data/sample.jsonl --val-file data/sample.jsonl \\
        [--model PATH] [--agl-base-url URL] [--agl-key KEY] [--run-name NAME] [--async] \\
        [--backend torch|verl] [key=value ...]

Dotted `key=value` overrides come last and win over everything (they are agl-train's keys,
docs/training.md). The Gateway and a Controller must be running (`run_local.sh` starts both).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf


def parse_args(argv: Sequence[str], prog: str) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog=prog, description="Train the example's agent with GRPO.")
    parser.add_argument("--train-file", required=True, help="training inputs: .parquet or .jsonl")
    parser.add_argument("--val-file", default=None, help="validation inputs: .parquet or .jsonl")
    parser.add_argument(
        "--model", default=None, help="a Hugging Face model directory (actor_rollout_ref.model.path)"
    )
    parser.add_argument(
        "--agl-base-url",
        default=None,
        help="the Gateway (default: agentlightning.agl_base_url, http://127.0.0.1:8080)",
    )
    parser.add_argument("--agl-key", default=None, help="the Gateway's key")
    parser.add_argument("--run-name", default=None, help="trainer.experiment_name")
    parser.add_argument(
        "--async",
        dest="async_",
        action="store_true",
        help="asynchronous collection: 2 x train_batch_size prompt groups in flight",
    )
    parser.add_argument("--backend", choices=("torch", "verl"), default="torch")
    args, rest = parser.parse_known_args(list(argv))
    bad = [a for a in rest if "=" not in a or a.startswith("-")]
    if bad:
        parser.error(f"unknown argument {bad[0]!r}: after the options come key=value overrides")
    return args, rest


def build_config(
    example: Mapping[str, Any], args: argparse.Namespace, overrides: Sequence[str], prog: str
) -> DictConfig:
    """train.yaml's defaults ← the example's block ← the options ← `key=value` overrides."""
    from agentlightning.config.loader import load_cli_config

    options: dict[str, Any] = {"data": {"train_files": str(Path(args.train_file).resolve())}}
    if args.val_file:
        options["data"]["val_files"] = str(Path(args.val_file).resolve())
    if args.model:
        options["actor_rollout_ref"] = {"model": {"path": args.model}}
    agl: dict[str, Any] = {}
    if args.agl_base_url:
        agl["agl_base_url"] = args.agl_base_url
    if args.agl_key is not None:
        agl["agl_key"] = args.agl_key
    if args.async_:
        agl["async_rollout"] = {"enabled": True}
    if agl:
        options["agentlightning"] = agl
    if args.run_name:
        options["trainer"] = {"experiment_name": args.run_name}
    merged = OmegaConf.merge(OmegaConf.create(dict(example)), OmegaConf.create(options))
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        OmegaConf.save(merged, f.name)
        path = f.name
    try:
        cfg = load_cli_config("train", ["--config", path, *overrides], prog=prog, strict=False)
    finally:
        Path(path).unlink(missing_ok=True)
    agl_cfg = cfg.agentlightning
    explicit = any(o.startswith("agentlightning.async_rollout.async_train_batch_size=") for o in overrides)
    if args.async_ and not explicit:
        agl_cfg.async_rollout.async_train_batch_size = 2 * int(cfg.data.train_batch_size)
    return cfg


EFFECTIVE_CONFIG = "agl-train.yaml"  # the composed config, in the run's output folder (as `agl train`)


def write_config(cfg: DictConfig) -> Path:
    """The composed config as a file in the run's output folder: what `agl-train` reads."""
    out = Path(str(cfg.trainer.output_dir)).resolve()
    out.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, out / EFFECTIVE_CONFIG)
    return out / EFFECTIVE_CONFIG


def main(example: Mapping[str, Any], argv: Sequence[str] | None = None, prog: str | None = None) -> None:
    prog = prog or Path(sys.argv[0]).name
    args, overrides = parse_args(sys.argv[1:] if argv is None else argv, prog)
    cfg = build_config(example, args, overrides, prog)  # a bad option or key exits 2 here, early
    from agentlightning.commands.backends import main as agl_train

    agl_train([f"backend={args.backend}", "--config", str(write_config(cfg))])
