"""`agl-train` and `agl-sft`: the training backends by name, and the commands that run the one named.

    agl-train [backend=torch|verl] [--config FILE.yaml] [key=value ...]
    agl-sft [backend=torch|verl] [--config FILE.yaml] [key=value ...]

Each backend is declared once in BACKENDS as `name: "module:function"`, its command line (called
with the arguments less `backend=`); its module is imported only when it runs, so that choosing
torch never imports verl and neither backend imports the other. `agl train`, `agl-demo`'s
trainer process and the examples' launcher all train through `main` here.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

from agentlightning.config.loader import fail

PROG = "agl-train"
DEFAULT = "torch"
BACKENDS: dict[str, str] = {
    "torch": "agentlightning.torch_backend.cli:main",  # the built-in torch engine (docs/training.md)
    "verl": "agentlightning.verl.cli:main",  # verl + vLLM on Ray (docs/verl_backend.md)
}
SFT_PROG = "agl-sft"
SFT_BACKENDS: dict[str, str] = {  # the same keys and rows on either (docs/sft.md)
    "torch": "agentlightning.torch_backend.sft:main",
    "verl": "agentlightning.verl.sft:main",  # verl's own SFT trainer
}


def backend_command(
    name: str, backends: dict[str, str] = BACKENDS, prog: str = PROG
) -> Callable[[list[str]], Any]:
    """The named backend's command line; exits 2 naming the backends for an unknown name, and
    saying what to install for one that is not installed (verl: the supported release)."""
    if name not in backends:
        fail(prog, f"backend must be {' or '.join(backends)}, got {name!r}")
    module, _, function = backends[name].partition(":")
    try:
        loaded = importlib.import_module(module)
    except ImportError as exc:  # VerlVersionError says which verl and how to install it
        fail(f"{prog} backend={name}", str(exc))
    entry: Callable[[list[str]], Any] = getattr(loaded, function)
    return entry


def split_backend(argv: Sequence[str]) -> tuple[str, list[str]]:
    """(the backend named by the last `backend=NAME`, or the default; the other arguments)."""
    named = [a.partition("=")[2] for a in argv if a.startswith("backend=")]
    return (named[-1] if named else DEFAULT), [a for a in argv if not a.startswith("backend=")]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "-h" in args or "--help" in args:  # the torch backend's help names every key, verl's too
        args = ["--help"]
    name, rest = split_backend(args)
    backend_command(name)(rest)
    return 0


def sft_main(argv: Sequence[str] | None = None) -> int:
    """`agl-sft`: the named backend's SFT command (`--help` lists the keys both read)."""
    name, rest = split_backend(list(sys.argv[1:] if argv is None else argv))
    result = backend_command(name, SFT_BACKENDS, SFT_PROG)(rest)
    return int(result or 0)


if __name__ == "__main__":
    raise SystemExit(main())
