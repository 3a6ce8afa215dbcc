"""`agl`: one command, with the components' commands as subcommands.

    agl train my_agent/config.yaml        = the trainer, with a local Gateway and Controller if the
                                            config names no Gateway
    agl serve port=8080 key=secret        = agl-server
    agl --help                            lists them; `agl X --help` is X's own help

Each subcommand is declared once in COMMANDS as `name: Command("module:main", "one line of help")`;
its module is imported only when it runs, and gets the rest of the command line. The components'
own console scripts (`agl-server`, `agl-controller`, `agl-train`, ...) stay as they are.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Command:
    target: str  # "package.module:function", called with the arguments after the subcommand
    help: str

    def load(self) -> Callable[[list[str]], Any]:
        module, _, function = self.target.partition(":")
        entry: Callable[[list[str]], Any] = getattr(importlib.import_module(module), function)
        return entry


COMMANDS: dict[str, Command] = {
    "init": Command("agentlightning.commands.init:main", "write a starter agent, dataset and config into a new folder"),
    "train": Command("agentlightning.commands.train:main", "train on a config (starts a local Gateway and Controller if it names no Gateway)"),
    "eval": Command("agentlightning.evaluation.cli:main", "evaluate a model or checkpoint on a dataset (= agl-eval)"),
    "sft": Command("agentlightning.commands.backends:sft_main", "supervised fine-tuning on recorded rollouts or a JSONL of chats (= agl-sft)"),
    "doctor": Command("agentlightning.doctor.cli:main", "is this harness trainable? rollouts through the Gateway, checked (= agl-doctor)"),
    "serve": Command("agentlightning.server.cli:main", "run the API Gateway (= agl-server)"),
    "controller": Command("agentlightning.controller.cli:main", "run the Rollout Controller (= agl-controller)"),
    "demo": Command("agentlightning.demo.cli:main", "the whole system on a laptop CPU with the tiny model (= agl-demo)"),
    "torch-server": Command("agentlightning.torch_backend.server_cli:main", "serve a model with the built-in torch engine (= agl-torch-server)"),
}  # fmt: skip


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {command.help}" for name, command in COMMANDS.items()]
    return (
        "usage: agl COMMAND [ARGS ...]\n\nCommands:\n"
        + "\n".join(lines)
        + "\n\n`agl COMMAND --help` describes a command and its settings."
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    command = COMMANDS.get(name)
    if command is None:
        from agentlightning.config.suggest import did_you_mean

        print(f"agl: no command {name!r}{did_you_mean(name, COMMANDS)}\n\n{usage()}", file=sys.stderr)
        return 2
    code = command.load()(rest)
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    raise SystemExit(main())
