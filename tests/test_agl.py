"""`agl`, the one command: its registry, `agl init`'s starter, and the new user's path end to end —
`agl init my_agent` then `agl train my_agent/config.yaml` with nothing else running: the
dashboard's URL printed, two steps trained, a clean exit, and no process left behind."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentlightning.cli import COMMANDS, main

from .pages import bash_blocks

AGL = [str(Path(sys.executable).parent / "agl")]  # the console script the docs tell a user to run


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name, command in COMMANDS.items():
        assert re.search(rf"^  {re.escape(name)} +{re.escape(command.help)}$", out, re.M), name


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_names_a_main_that_exists(name: str) -> None:
    module, _, function = COMMANDS[name].target.partition(":")
    spec = importlib.util.find_spec(module)  # without importing it (torch, uvicorn, ...)
    assert spec is not None and spec.origin is not None, module
    tree = ast.parse(Path(spec.origin).read_text())
    assert function in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, COMMANDS[name].target


def test_an_unknown_command_is_refused_with_a_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trian"]) == 2
    assert "agl: no command 'trian' (did you mean train?)" in capsys.readouterr().err


def test_the_rest_of_the_line_goes_to_the_command(tmp_path: Path) -> None:
    assert main(["init", str(tmp_path / "a")]) == 0
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [
        "agent.py",
        "config.yaml",
        "train.jsonl",
        "val.jsonl",
    ]


def test_init_refuses_a_folder_that_is_not_empty(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "mine.txt").write_text("keep me")
    with pytest.raises(SystemExit) as exit_:
        main(["init", str(tmp_path)])
    assert exit_.value.code == 2
    assert f"agl init: {tmp_path} exists and is not empty" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]


def test_the_starter_config_is_read_whole_by_the_trainer(tmp_path: Path) -> None:
    """Every key of the starter's config does something (the torch backend's strict key check)."""
    from omegaconf import OmegaConf

    from agentlightning.config.loader import load_cli_config, merge
    from agentlightning.torch_backend.config import check_torch_keys

    assert main(["init", str(tmp_path / "s")]) == 0
    starter = OmegaConf.load(tmp_path / "s" / "config.yaml")
    check_torch_keys(merge(load_cli_config("train", [], prog="test", strict=False), starter))


def _processes_in(folder: Path) -> list[int]:
    """Pids of the processes whose working directory is `folder` (the Controller's agents run there)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if Path(os.readlink(entry / "cwd")).resolve() == folder.resolve():
                    pids.append(int(entry.name))
            except OSError:  # gone meanwhile, or not ours to read
                continue
    return pids


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")  # a zombie is gone


def _started_pids(out: str) -> list[int]:
    return [int(p) for p in re.findall(r"^agl train: (?:Gateway .*?|Controller  )\(?pid (\d+)", out, re.M)]


@pytest.mark.process
def test_init_then_train_with_nothing_else_running(tmp_path: Path) -> None:
    """The two commands of docs/own_agent.md's quick start, read from the page (the lines before
    them make the venv this suite runs in), the second with the two steps the page shows."""
    init_line, train_line = (shlex.split(line)[1:] for line in bash_blocks("docs/own_agent.md")[0][2:])
    init = subprocess.run([*AGL, *init_line], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert init.returncode == 0, init.stderr
    train = subprocess.run(
        [*AGL, *train_line, "trainer.total_training_steps=2"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    assert re.search(r"^agl train: Dashboard   http://127\.0\.0\.1:\d+/ui/#key=\S+$", train.stdout, re.M)
    run = tmp_path / "my_agent" / "runs" / "starter"  # the config's output_dir, relative to the file
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in steps if "training/reward" in r) == 2
    pids = _started_pids(train.stdout)
    assert len(pids) == 2, train.stdout
    assert all(_gone(pid) for pid in pids)
    assert _processes_in(tmp_path / "my_agent") == []
    assert "failed" not in train.stderr  # every rollout of the starter ran
    assert "HTTP Request" not in train.stderr  # the console at the default level: no line per request


@pytest.mark.process
def test_sigterm_stops_what_agl_train_started(tmp_path: Path) -> None:
    assert main(["init", str(tmp_path / "my_agent")]) == 0
    proc = subprocess.Popen(
        [*AGL, "train", "my_agent/config.yaml"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    lines = []
    try:
        for line in proc.stdout:  # until the Controller is up: both services started
            lines.append(line)
            if line.startswith("agl train: Controller"):
                break
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    pids = _started_pids("".join(lines))
    assert len(pids) == 2 and all(_gone(pid) for pid in pids)
    deadline = time.monotonic() + 30  # agents the Controller stopped may take a moment to be reaped
    while _processes_in(tmp_path / "my_agent") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_in(tmp_path / "my_agent") == []


def _train(folder: Path, *overrides: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*AGL, "train", "my_agent/config.yaml", *overrides],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


BROKEN_RUN = 'raise RuntimeError("the tool server is down")  # a bug of the agent\n        answer = solve('


@pytest.mark.process
@pytest.mark.parametrize(
    ("override", "edit", "cause"),
    [
        ("agentlightning.local.agent_class=my_agnet:Agent", None, "No module named 'my_agnet'"),
        (None, ("answer = solve(", BROKEN_RUN), "RuntimeError: the tool server is down"),
    ],
    ids=["bad-module-path", "agent-raises"],
)
def test_a_run_whose_every_rollout_fails_stops_naming_the_cause(
    tmp_path: Path, override: str | None, edit: tuple[str, str] | None, cause: str
) -> None:
    assert main(["init", str(tmp_path / "my_agent")]) == 0
    if edit is not None:
        agent = tmp_path / "my_agent" / "agent.py"
        agent.write_text(agent.read_text().replace(*edit, 1))
    result = _train(tmp_path, *([override] if override else []))
    assert result.returncode == 1, result.stderr[-3000:]
    # before any training step, on the console, with the agents' own error
    line = next(x for x in result.stderr.splitlines() if x.startswith("agl-train: step 0 validation"))
    assert "4 of 4 rollouts failed" in line and cause in line, line
    pids = _started_pids(result.stdout)
    assert len(pids) == 2 and all(_gone(pid) for pid in pids)


@pytest.mark.process
def test_no_controller_is_said_within_the_warning_time(tmp_path: Path) -> None:
    from agentlightning.launch import start_gateway

    assert main(["init", str(tmp_path / "my_agent")]) == 0
    with start_gateway(key="k", store_url="memory://", log_path=tmp_path / "gw.log") as gateway:
        started = time.monotonic()
        result = _train(
            tmp_path,
            f"agentlightning.agl_base_url={gateway.url}",  # a Gateway, and no Controller for it
            "agentlightning.agl_key=k",
            "agentlightning.unclaimed_warning_seconds=1",
            "agentlightning.rollout_timeout_seconds=4",
            "agentlightning.rollout_grace_seconds=1",
        )
        elapsed = time.monotonic() - started
    assert "agl train: Gateway" not in result.stdout  # given a Gateway, it starts none
    warning = next(x for x in result.stderr.splitlines() if "event='rollouts_not_claimed'" in x)
    assert "level='warning' event='rollouts_not_claimed'" in warning  # a log line at warning level
    assert f"none of the 4 rollouts queued on the Gateway at {gateway.url}" in warning
    assert "is a Controller running for this Gateway?" in warning
    # then the stall check fails them (timeout + grace) and the run stops, naming why
    assert result.returncode == 1, result.stderr[-3000:]
    assert "no rollout finished for 5s" in result.stderr
    assert elapsed < 300


def test_a_misspelt_key_is_refused_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["init", str(tmp_path / "my_agent")]) == 0
    capsys.readouterr()
    monkeypatch.setattr("agentlightning.commands.train.LocalServices.start", _never_called)
    with pytest.raises(SystemExit) as exit_:
        main(
            [
                "train",
                str(tmp_path / "my_agent" / "config.yaml"),
                "agentlightning.locl.agent_class=agent:Agent",
            ]
        )
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert (
        err
        == "agl train: bad config: agentlightning.locl: not a key of agentlightning (did you mean agentlightning.local?)\n"
    )


def _never_called(*args: object) -> str:
    raise AssertionError("services started for a config that was refused")


@pytest.mark.parametrize(
    "argv",
    [
        ["cfg.yaml", "backend=torch", "a.b=1"],
        ["--config", "cfg.yaml", "a.b=1", "backend=torch"],
        ["a.b=1", "cfg.yaml", "backend=torch"],
    ],
)
def test_the_config_file_is_positional_or_given_with_config(
    tmp_path: Path, argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentlightning.commands.train import split_args

    (tmp_path / "cfg.yaml").write_text("data: {}\n")
    monkeypatch.chdir(tmp_path)
    assert split_args(argv) == (Path("cfg.yaml"), ["backend=torch"], ["a.b=1"])


def test_paths_in_the_file_are_relative_to_its_folder(tmp_path: Path) -> None:
    from agentlightning.commands.train import load_user_file

    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub" / "cfg.yaml"
    path.write_text(
        "data: {train_files: [a.jsonl, /abs/b.jsonl], val_files: v.jsonl}\n"
        "trainer: {output_dir: 'runs/${trainer.experiment_name}', experiment_name: x}\n"
    )
    user = load_user_file(path)
    folder = path.resolve().parent
    assert list(user.data.train_files) == [str(folder / "a.jsonl"), "/abs/b.jsonl"]
    assert user.data.val_files == str(folder / "v.jsonl")
    assert user.trainer.output_dir == str(folder / "runs" / "x")  # interpolations still resolve
