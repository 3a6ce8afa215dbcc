"""Bad input to agl-eval: a clear error naming what was wrong, exit 2, before anything starts,
and no report (nor even the eval's folder) left behind."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from agentlightning.demo.task import make_dataset
from agentlightning.evaluation.cli import main, runner_overrides
from agentlightning.procs import free_port


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in make_dataset(3, seed=5)))
    return path


def fails(capsys: pytest.CaptureFixture[str], tmp_path: Path, *args: str) -> str:
    out = tmp_path / "eval"
    with pytest.raises(SystemExit) as exit_info:
        main([*args, f"output_dir={out}"])
    assert exit_info.value.code == 2
    assert not out.exists()  # nothing started, nothing written
    return capsys.readouterr().err


def test_a_folder_that_is_not_a_checkpoint(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "not_a_checkpoint"
    folder.mkdir()
    (folder / "weights.bin").write_bytes(b"\0" * 8)
    err = fails(capsys, tmp_path, f"data={data}", f"policies=[mine={folder}]")
    assert f"policy 'mine={folder}'" in err
    assert "neither a checkpoint of ours (loop_state.json and policy_state.pt) nor a Hugging Face" in err


def test_a_checkpoint_without_the_policy_state(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "run" / "global_step_3"
    folder.mkdir(parents=True)
    (folder / "loop_state.json").write_text(json.dumps({"config": {}}))
    err = fails(capsys, tmp_path, f"data={data}", f"policies=[{folder}]")
    assert "has no policy_state.pt: not a torch-backend checkpoint" in err


def test_a_missing_folder(tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = fails(capsys, tmp_path, f"data={data}", f"policies=[{tmp_path / 'nowhere'}]")
    assert "nowhere does not exist" in err


def test_an_endpoint_that_does_not_answer(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    err = fails(capsys, tmp_path, f"data={data}", f"policies=[remote={url}]")
    assert f"policy remote: the endpoint {url} does not answer" in err


def test_a_dataset_with_a_malformed_line(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = data.read_text().splitlines()
    lines.insert(1, '{"id": "broken", "question": ')
    data.write_text("\n".join(lines) + "\n")
    err = fails(capsys, tmp_path, f"data={data}", "policies=[demo]")
    assert f"data: {data} line 2 is not valid JSON" in err


def test_a_dataset_line_that_is_not_an_object(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data.write_text(data.read_text() + "[1, 2]\n")
    err = fails(capsys, tmp_path, f"data={data}", "policies=[demo]")
    assert "sample 3 of" in err and "is a list, not an object" in err


def test_k_above_n(tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = fails(capsys, tmp_path, f"data={data}", "policies=[demo]", "n=2", "k=[1,3]")
    assert "k=3 needs at least 3 samples per task, but n=2: raise n" in err


def test_no_policy_and_a_misspelt_key(tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "policies=[...] is empty" in fails(capsys, tmp_path, f"data={data}")
    assert "temprature: not a key of the config (did you mean temperature?)" in fails(
        capsys, tmp_path, f"data={data}", "policies=[demo]", "temprature=1"
    )


def test_an_agent_interpreter_or_folder_that_is_not_there(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = fails(
        capsys, tmp_path, f"data={data}", "policies=[demo]", f"agent.python={tmp_path / 'nope/python'}"
    )
    assert "agent.python" in err and "is not an executable" in err
    err = fails(capsys, tmp_path, f"data={data}", "policies=[demo]", f"agent.cwd={tmp_path / 'nowhere'}")
    assert "agent.cwd" in err and "is not a folder" in err


def test_the_agents_interpreter_and_folder_reach_the_controller(tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)  # as a venv's interpreter is
    agent = OmegaConf.create({"python": str(venv / "python"), "cwd": str(tmp_path)})
    # the link itself, not where it points: its venv is found from the path it was started by
    assert runner_overrides(agent) == [
        f"local_runner.python={venv / 'python'}",
        f"local_runner.cwd={tmp_path}",
    ]
    assert runner_overrides(OmegaConf.create({"python": None, "cwd": None})) == []


def test_an_agents_env_map_replaces_the_demos(tmp_path: Path) -> None:
    from agentlightning.config.loader import load_cli_config

    def env_map(*args: str) -> dict[str, str]:
        cfg = load_cli_config("eval", list(args), prog="agl-eval", free_maps=["agent.env_map"])
        return dict(cfg.agent.env_map)

    assert env_map() == {"QUESTION": "input.question", "ANSWER": "input.answer"}  # the demo agent's
    assert env_map("agent.env_map={TASK_ID: input.task_id}") == {"TASK_ID": "input.task_id"}
    config = tmp_path / "eval.yaml"
    config.write_text("agent:\n  env_map: {TASK_ID: input.task_id}\n")
    assert env_map("--config", str(config), "agent.env_map.REPO=input.repo") == {
        "TASK_ID": "input.task_id",
        "REPO": "input.repo",
    }
    with pytest.raises(SystemExit):  # the rest of the config stays strict
        env_map("agent.envmap.X=input.x")


def test_an_agent_command_with_a_class_or_interpreter_or_none(
    tmp_path: Path, data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = (f"data={data}", "policies=[demo]")
    err = fails(capsys, tmp_path, *base, "agent.command=[node,agent.mjs]")  # the demo's class is still set
    assert "with it set agent.agent_class=null" in err
    err = fails(capsys, tmp_path, *base, "agent.command=[node,agent.mjs]", "agent.agent_class=null",
                f"agent.python={sys.executable}")  # fmt: skip
    assert "leave agent.python unset" in err
    err = fails(capsys, tmp_path, *base, "agent.command='node \"agent.mjs'", "agent.agent_class=null")
    assert "agent.command: No closing quotation" in err
    err = fails(capsys, tmp_path, *base, "agent.agent_class=null")
    assert "agent.agent_class is not set" in err and "agent.command" in err
