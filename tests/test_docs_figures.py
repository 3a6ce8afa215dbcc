"""The docs check of the commands behind the docs' figures: every `bench/*.py`, `scripts/*.py` or
`examples/**/*.py` command that README.md, docs/*.md or examples/*/README.md show (a line of a
block, `$ ` prompt or not, or an inline code span) is a file of the repository, and every `--flag`
it passes is one that script's argparse declares. A figure names the command that printed it, so a
renamed script or flag must take the figure's line with it.

The flags are read from the script's source (the option strings of its `add_argument` calls,
every parser and subparser of the file together), not from its `--help`: no script is imported or
run, so the check costs milliseconds. A script that builds an option string at run time (an
f-string over a config's fields) is asked instead, once per subcommand the pages use:
`python -m MODULE [SUBCOMMAND] --help`."""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
import sys
from functools import cache

import pytest

from .pages import REPO, bash_blocks, is_placeholder

PAGES = sorted(
    str(p.relative_to(REPO))
    for p in [REPO / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "examples").glob("*/README.md")]
)
ROOTS = ("bench/", "scripts/", "examples/")

_BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
_INLINE = re.compile(r"`([^`]+)`")
# What may stand before the script on a command line: a prompt, environment assignments, `nice`,
# an interpreter (the system's, a venv's).
_PREFIX = re.compile(r"^(?:\$|nice|[A-Z_]+=\S*|(?:\S*/)?python3?(?:\.\d+)?)$")


def script_of(words: list[str]) -> tuple[str, list[str]] | None:
    """The script a command line runs (a repository path) and the words after it, or None when the
    line is not one of ours: `[$] [VAR=…] [nice] [python] bench/x.py …` or `python -m bench.x …`."""
    for i, word in enumerate(words):
        if word == "-m" and i > 0 and i + 1 < len(words):
            module = words[i + 1]
            if module.split(".")[0] + "/" in ROOTS:
                return module.replace(".", "/") + ".py", words[i + 2 :]
            return None
        if word.endswith(".py") and word.startswith(ROOTS):
            return word, words[i + 1 :]
        if not _PREFIX.match(word):
            return None
    return None


def _lines(page: str) -> list[str]:
    """The page's command-like lines: each block's lines (a `\\` continuation joined, comments
    dropped for shell blocks), then its inline code spans outside blocks (whitespace made single)."""
    text = (REPO / page).read_text()
    lines = [line for block in bash_blocks(page) for line in _joined(block)]
    for lang, body in _BLOCK.findall(text):
        if lang not in ("bash", "sh", "shell"):
            lines += _joined([line.strip() for line in body.splitlines()])
    for span in _INLINE.findall(_BLOCK.sub("", text)):
        lines += " ".join(span.split()).split(" && ")
    return lines


def _joined(lines: list[str]) -> list[str]:
    out: list[str] = []
    for line in lines:
        if out and out[-1].endswith("\\"):
            out[-1] = out[-1][:-1].rstrip() + " " + line
        else:
            out.append(line)
    return out


def commands(page: str) -> list[tuple[str, str, list[str]]]:
    """(the line, its script, the words after the script) for each command of ours on `page`."""
    out = []
    for line in _lines(page):
        try:
            words = shlex.split(line, comments=True)
        except ValueError:  # unbalanced quotes: prose in a span, not a command
            continue
        found = script_of(words)
        if found:
            out.append((line, *found))
    return out


def flags_passed(words: list[str]) -> list[str]:
    """The `--flag`s of a command's words: `--x=1` as `--x`, `[--x` of a usage line as `--x`; an
    argument of the flag before it (`--gateway-cmd "sh -c '… --y'"`) is one word and not looked in."""
    out = []
    for word in words:
        word = word.lstrip("[").rstrip("]")
        if word.startswith("--") and len(word) > 2 and not is_placeholder(word):
            out.append(word.split("=", 1)[0])
    return out


def accepted_flags(script: str, words: list[str] = []) -> frozenset[str]:  # noqa: B006 (never mutated)
    """The flags `script` accepts, run with `words`: the option strings of its `add_argument`
    calls, read from its source; `--help`'s for a script that makes some at run time."""
    literal, dynamic = _declared(script)
    if not dynamic:
        return literal
    first = next((w for w in words if not w.startswith("-")), None)
    return _helped(script, (first,) if first and words[0] == first else ())


@cache
def _declared(script: str) -> tuple[frozenset[str], bool]:
    """The literal option strings of `script`'s `add_argument` calls, and whether any is not one."""
    tree = ast.parse((REPO / script).read_text(), script)
    found, dynamic = {"--help"}, False
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument" and node.args:
            first = node.args[0]
            if not isinstance(first, ast.Constant):
                dynamic = True
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("-"):
                    found.add(arg.value)
    return frozenset(found), dynamic


@cache
def _helped(script: str, subcommand: tuple[str, ...]) -> frozenset[str]:
    module = script.removesuffix(".py").replace("/", ".")
    shown = subprocess.run(
        [sys.executable, "-m", module, *subcommand, "--help"],
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return frozenset(re.findall(r"(?<![\w-])--[a-z][\w-]*", shown))


@pytest.mark.parametrize("page", PAGES)
def test_every_script_a_page_runs_exists_and_takes_the_flags_shown(page: str) -> None:
    for line, script, words in commands(page):
        assert (REPO / script).is_file(), f"{page}: `{line}`: {script} is not in the repository"
        unknown = [f for f in flags_passed(words) if f not in accepted_flags(script, words)]
        assert not unknown, f"{page}: `{line}`: {script} accepts no {', '.join(unknown)}"


def test_the_check_finds_the_commands_it_exists_for() -> None:
    """The check reads what it should: commands in blocks and spans, with and without an
    interpreter, `python -m` of an example's module; and refuses a flag no parser declares."""
    found = {script for page in PAGES for _, script, _ in commands(page)}
    assert {"bench/proxy.py", "bench/doctor_table.py", "examples/swe/tasks.py"} <= found
    assert script_of(shlex.split("PYTHONPATH=$PWD .venv/bin/python bench/chaos.py --seeds 0")) == (
        "bench/chaos.py",
        ["--seeds", "0"],
    )
    assert script_of(["$", "python", "-m", "examples.swe.tiny_policy", "eval"]) == (
        "examples/swe/tiny_policy.py",
        ["eval"],
    )
    assert script_of(["pytest", "tests/examples/test_swe_hacks.py"]) is None
    assert script_of(["python", "-m", "pytest", "bench/x.py"]) is None
    assert flags_passed(["--a=1", "[--b", "3]", "--gateway-cmd", "sh -c 'x --c'"]) == [
        "--a",
        "--b",
        "--gateway-cmd",
    ]
    assert "--only" in accepted_flags("bench/doctor_table.py")
    assert "--no-such-flag" not in accepted_flags("bench/doctor_table.py")
    # tiny_policy's `build` makes a flag of each field of its config: asked with `build --help`
    assert {"--steps", "--lr"} <= accepted_flags("examples/swe/tiny_policy.py", ["build", "OUT", "--lr", "1"])
