"""`agl-train`'s backend registry (`agentlightning/commands/backends.py`): each name points at a
command line that exists, `backend=` picks it (the last one wins, torch by default), an unknown
name is refused naming the backends, and choosing torch does not import verl."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from agentlightning.commands.backends import BACKENDS, main, split_backend

REPO = Path(__file__).resolve().parent.parent
CALLS: list[list[str]] = []  # what `record`, registered as a backend below, was called with


def record(argv: list[str]) -> None:
    CALLS.append(argv)


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_every_backend_names_a_main_that_exists(name: str) -> None:
    module, _, function = BACKENDS[name].partition(":")
    # Read, not imported: the verl backend's package refuses to import without verl installed.
    path = REPO / (module.replace(".", "/") + ".py")
    tree = ast.parse(path.read_text())
    assert function in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, BACKENDS[name]


def test_backend_is_picked_by_name_and_removed_from_the_arguments() -> None:
    assert split_backend(["--config", "a.yaml", "x.y=1"]) == ("torch", ["--config", "a.yaml", "x.y=1"])
    assert split_backend(["backend=verl", "x.y=1", "backend=torch"]) == ("torch", ["x.y=1"])


def test_the_named_backend_gets_the_rest_of_the_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(BACKENDS, "echo", f"{__name__}:record")
    CALLS.clear()
    assert main(["--config", "c.yaml", "backend=echo", "a.b=1"]) == 0
    assert CALLS == [["--config", "c.yaml", "a.b=1"]]


def test_an_unknown_backend_exits_2_naming_the_backends(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["backend=tensorflow", "a.b=1"])
    assert exc.value.code == 2
    assert "agl-train: backend must be torch or verl, got 'tensorflow'" in capsys.readouterr().err


def test_help_is_the_torch_backends_whatever_the_backend() -> None:
    # In a fresh process: the torch backend's help, and verl never imported on the way.
    script = (
        "import sys; from agentlightning.commands.backends import main; main(['backend=verl', '--help']); "
        "assert not [m for m in sys.modules if m.startswith('agentlightning.verl')], 'verl imported'"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: agl-train [backend=torch|verl]")


def test_a_backend_that_is_not_installed_exits_2_saying_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # as `backend=verl` without verl: its package refuses to import, naming the release to install
    monkeypatch.setitem(BACKENDS, "gone", "agentlightning.no_such_backend:main")
    with pytest.raises(SystemExit) as exc:
        main(["backend=gone"])
    assert exc.value.code == 2
    assert (
        "agl-train backend=gone: No module named 'agentlightning.no_such_backend'" in capsys.readouterr().err
    )
