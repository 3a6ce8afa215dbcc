"""The shell commands a page of the docs tells a user to type: the lines of its ```bash blocks and
its inline `agl …` / `make …` spans, so that a docs check can hold each to what the code accepts."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NEW_USER_PAGES = ("README.md", "docs/own_agent.md")

_BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
_INLINE = re.compile(r"`([^`]+)`")
_COMMAND = re.compile(r"^(?:\.venv/bin/)?(?:agl(?:-[\w-]+)?|make)(?: |$)")


def bash_blocks(page: str) -> list[list[str]]:
    """Each ```bash block of `page`, as its commands: comments and blank lines dropped."""
    text = (REPO / page).read_text()
    blocks = []
    for lang, body in _BLOCK.findall(text):
        if lang in ("bash", "sh", "shell"):
            lines = [line.split("#", 1)[0].strip() for line in body.splitlines()]
            blocks.append([line for line in lines if line])
    return blocks


def inline_commands(page: str) -> list[str]:
    """The inline code spans of `page` outside its blocks that are commands of ours (`agl …`,
    `agl-… `, `make …`), whitespace made single, a span of `a && b` as two; a span that is a
    command's output (`agl train: bad config: …`) is not one."""
    text = _BLOCK.sub("", (REPO / page).read_text())
    out = []
    for span in _INLINE.findall(text):
        for part in " ".join(span.split()).split(" && "):
            words = part.split()
            if _COMMAND.match(part) and not (len(words) > 1 and words[1].endswith(":")):
                out.append(part)
    return out


def commands(page: str) -> list[list[str]]:
    """Every command of `page` (blocks, then inline spans), as argument lists."""
    lines = [line for block in bash_blocks(page) for line in block] + inline_commands(page)
    return [shlex.split(line) for line in lines]


def is_placeholder(word: str) -> bool:
    """A word that stands for the user's value in a usage line: `CONFIG`, `[key=value`, `…`."""
    return word in ("…", "...") or word.startswith("[") or (word.isupper() and word.isalpha())
