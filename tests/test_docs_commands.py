"""The docs check of the new user's pages (README.md, docs/own_agent.md): every command they show
is one we have, and every `agl train` line is a config the trainer accepts. The quick start's
commands themselves run in `tests/test_agl.py` (read from the page); verl's reading of the verl
lines in `tests/verl/test_config.py`."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from agentlightning.cli import COMMANDS
from agentlightning.cli import main as agl

from .pages import NEW_USER_PAGES, REPO, bash_blocks, commands, is_placeholder

MAKEFILE = (REPO / "Makefile").read_text()
SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
# Shell lines of the pages that are not ours, each with what makes it right.
SHELL: dict[tuple[str, ...], str] = {("source", ".venv/bin/activate"): "VENV := .venv"}


def _make_targets() -> set[str]:
    return set(re.findall(r"^([\w.-]+):", MAKEFILE, re.M))


def _agl_lines(page: str) -> list[list[str]]:
    """The page's `agl` command lines, as the words after `agl`."""
    return [words[1:] for words in commands(page) if words[0] in ("agl", ".venv/bin/agl")]


def _train_lines(page: str) -> list[list[str]]:
    """The page's `agl train` lines with arguments a user would type (no placeholders)."""
    return [
        words
        for words in _agl_lines(page)
        if words[:1] == ["train"] and len(words) > 1 and not any(map(is_placeholder, words))
    ]


@pytest.mark.parametrize("page", NEW_USER_PAGES)
def test_every_command_on_the_page_is_one_we_have(page: str) -> None:
    for words in commands(page):
        program, args = words[0], words[1:]
        if program == "make":
            target = next(a for a in args if "=" not in a)
            assert target in _make_targets(), f"{page}: `make {target}`: no such target"
            for variable in (a.partition("=")[0] for a in args if "=" in a):
                assert f"$({variable})" in MAKEFILE, (
                    f"{page}: `make {variable}=…`: the Makefile never reads it"
                )
        elif program in ("agl", ".venv/bin/agl"):
            assert args[0] in (*COMMANDS, "--help"), f"{page}: `agl {args[0]}`: no such command"
        elif program.startswith("agl-"):
            assert program in SCRIPTS, f"{page}: `{program}`: no such console script"
        else:
            assert tuple(words) in SHELL, f"{page}: `{' '.join(words)}`: not a command the check knows"
            assert SHELL[tuple(words)] in MAKEFILE


def test_the_quick_start_block_is_the_one_the_end_to_end_test_runs() -> None:
    """tests/test_agl.py runs the page's block from `agl init` on; the lines before it make the
    venv the suite itself runs in."""
    (block,) = bash_blocks("docs/own_agent.md")
    assert block[:2] == ["make venv", "source .venv/bin/activate"]
    assert [line.split()[:2] for line in block[2:]] == [["agl", "init"], ["agl", "train"]]


@pytest.mark.parametrize("page", NEW_USER_PAGES)
def test_every_agl_train_line_is_a_config_the_trainer_accepts(
    page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each line with `--check` added: on the starter `agl init my_agent` writes, from the folder
    the page runs it in, or on a config the repository ships (an example's), from its root. verl's
    lines are read by verl in tests/verl/test_config.py."""
    monkeypatch.chdir(tmp_path)
    assert agl(["init", "my_agent"]) == 0
    lines = [words for words in _train_lines(page) if "backend=verl" not in words]
    assert lines, f"{page} shows no `agl train` line to check"
    for words in lines:
        monkeypatch.chdir(REPO if (REPO / words[1]).is_file() else tmp_path)
        capsys.readouterr()
        assert agl([*words, "--check"]) == 0, f"{page}: agl {' '.join(words)}"
        assert "good for the torch backend" in capsys.readouterr().out


def test_the_pages_misspelt_key_message_is_what_agl_train_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    page = (REPO / "docs/own_agent.md").read_text()
    (shown,) = re.findall(r"`(agl train: bad config: [^`]+)`", page)
    key = re.search(r"bad config: (\S+):", shown)
    assert key is not None
    monkeypatch.chdir(tmp_path)
    assert agl(["init", "my_agent"]) == 0
    with pytest.raises(SystemExit) as exit_:
        agl(["train", "my_agent/config.yaml", "--check", f"{key.group(1)}=x"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip() == shown


def test_the_pages_kubernetes_settings_are_keys_of_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The page's `agentlightning:` block, put in the starter instead of `local:` as it says."""
    page = (REPO / "docs/own_agent.md").read_text()
    (block,) = re.findall(r"```yaml\n(.*?)```", page, re.S)
    monkeypatch.chdir(tmp_path)
    assert agl(["init", "my_agent"]) == 0
    config = tmp_path / "my_agent" / "config.yaml"
    starter = OmegaConf.load(config)
    del starter.agentlightning["local"]
    OmegaConf.save(OmegaConf.merge(starter, OmegaConf.create(block)), config)
    (tmp_path / "my_agent" / "job.yaml.j2").write_text("kind: Job\n")  # the user's template
    assert agl(["train", "my_agent/config.yaml", "--check"]) == 0, capsys.readouterr().err


@pytest.mark.parametrize(
    ("line", "refused"),
    [
        (["train", "my_agent/config.yaml", "--check", "trainer.total_training_step=2"], "did you mean"),
        (["train", "my_agent/config.yaml", "--check", "actor_rollout_ref.rollout.n=0"], "rollout.n"),
    ],
)
def test_check_refuses_a_bad_config_naming_the_key(
    line: list[str],
    refused: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    assert agl(["init", "my_agent"]) == 0
    with pytest.raises(SystemExit) as exit_:
        agl(line)
    assert exit_.value.code == 2
    assert refused in capsys.readouterr().err
    assert not (tmp_path / "my_agent" / "runs").exists()  # --check starts and writes nothing
