"""Pieces of the controller that need no process: env, agent class names, exits, config."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from agentlightning.config.loader import load_cli_config
from agentlightning.config.schema import ConfigError
from agentlightning.controller import cli
from agentlightning.controller.bootstrap import (
    AgentClassError,
    load_agent_class,
    parse_agent_class,
    run_agent,
)
from agentlightning.controller.config import load_controller_config
from agentlightning.controller.env import EnvMapError, agent_env, env_map_values
from agentlightning.controller.local import classify_exit, safe_name
from agentlightning.controller.runner import attempt_number, new_attempt_id
from agentlightning.schemas import Rollout


def rollout(input: object, env_map: dict[str, str], **extra: object) -> Rollout:
    return Rollout.model_validate(
        {
            "rollout_id": "r-1",
            "input": input,
            "config": {"local": {"agent_class": "m.A", "env_map": env_map}},
            **extra,
        }
    )


# --- env ---------------------------------------------------------------------------------


def test_env_map_strings_as_is_everything_else_as_json() -> None:
    data = {
        "q": "why?",
        "n": 7,
        "f": 0.5,
        "b": True,
        "none": None,
        "items": [{"x": "deep"}, 2],
        "obj": {"a": [1]},
    }
    env = env_map_values(
        rollout(data, {}, metadata={"data_id": "d7"}),
        {
            "Q": "input.q",
            "N": "input.n",
            "F": "input.f",
            "B": "input.b",
            "NONE": "input.none",
            "DEEP": "input.items.0.x",
            "SECOND": "input.items.1",
            "OBJ": "input.obj",
            "DATA": "metadata.data_id",
            "RID": "rollout_id",
            "TRAIN": "is_train",
        },
    )
    assert env == {
        "Q": "why?",
        "N": "7",
        "F": "0.5",
        "B": "true",
        "NONE": "null",
        "DEEP": "deep",
        "SECOND": "2",
        "OBJ": '{"a":[1]}',
        "DATA": "d7",
        "RID": "r-1",
        "TRAIN": "true",
    }


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("input.missing", "input has no key 'missing' (keys: a, list)"),
        ("input.list.5", "index 5 is out of range, input.list has 2 items"),
        ("input.list.x", "input.list is a list, 'x' is not an index"),
        ("input.a.deeper", "input.a is of type str, it has no 'deeper'"),
        ("question", "must start with one of input, metadata, rollout_id, is_train"),
    ],
)
def test_env_map_errors_name_the_entry_and_the_path(path: str, message: str) -> None:
    with pytest.raises(EnvMapError) as err:
        env_map_values(rollout({"a": "x", "list": [1, 2]}, {}), {"VAR": path})
    assert str(err.value).startswith("env_map VAR:") and message in str(err.value)


@pytest.mark.parametrize("name", ["AGL_KEY", "1BAD", "WITH-DASH", ""])
def test_env_map_rejects_reserved_and_invalid_names(name: str) -> None:
    with pytest.raises(EnvMapError):
        env_map_values(rollout({"a": 1}, {}), {name: "input.a"})


def test_agent_env_has_the_contract_variables_and_wins_over_the_base() -> None:
    r = rollout({"q": "hi"}, {"Q": "input.q"}, is_train=False)
    base = {"AGL_KEY": "stale", "PATH": "/bin", "OPENAI_API_KEY": "the user's own"}
    env = agent_env(r, "attempt-1-x", "http://gw:81/", "k", base=base, conventional=False)
    root = "http://gw:81/proxy/rollout/r-1/attempt/attempt-1-x/mode/val"
    assert env == {
        "PATH": "/bin",
        "OPENAI_API_KEY": "the user's own",
        "Q": "hi",
        "AGL_OPENAI_BASE_URL": f"{root}/openai/v1",
        "AGL_ANTHROPIC_BASE_URL": f"{root}/anthropic",
        "AGL_EVENT_URL": "http://gw:81/api/rollouts/r-1/attempt/attempt-1-x/events",
        "AGL_KEY": "k",
    }
    # On by default: the names harnesses read, with the attempt's key; env_map may still set them.
    r = rollout({"q": "hi", "url": "http://mine/v1"}, {"OPENAI_BASE_URL": "input.url"}, is_train=False)
    env = agent_env(r, "attempt-1-x", "http://gw:81/", "k", base=base)
    assert {k: v for k, v in env.items() if k.startswith(("OPENAI_", "ANTHROPIC_"))} == {
        "OPENAI_BASE_URL": "http://mine/v1",
        "OPENAI_API_KEY": "k",
        "ANTHROPIC_BASE_URL": f"{root}/anthropic",
        "ANTHROPIC_API_KEY": "k",
        "ANTHROPIC_AUTH_TOKEN": "k",
    }


# --- agent classes -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "parsed"),
    [
        ("pkg.mod.Agent", ("pkg.mod", "Agent")),
        ("pkg.mod:Agent", ("pkg.mod", "Agent")),
        ("mod:Outer.Inner", ("mod", "Outer.Inner")),
        (" mod.Agent ", ("mod", "Agent")),
    ],
)
def test_agent_class_forms(spec: str, parsed: tuple[str, str]) -> None:
    assert parse_agent_class(spec) == parsed


@pytest.mark.parametrize("spec", ["Agent", "mod:", "mod.Agent:", "a b.C", "mod::A", "9mod.A", "mod:A:B", ""])
def test_malformed_agent_class_is_refused(spec: str) -> None:
    with pytest.raises(AgentClassError):
        parse_agent_class(spec)


def test_load_agent_class_reasons() -> None:
    assert load_agent_class("tests.controller.agents:RewardAgent").__name__ == "RewardAgent"
    with pytest.raises(AgentClassError, match="cannot import module 'no_such_mod'"):
        load_agent_class("no_such_mod.A")
    with pytest.raises(AgentClassError, match="has no 'Missing'"):
        load_agent_class("tests.controller.agents.Missing")
    with pytest.raises(AgentClassError, match="no run\\(\\) method"):
        load_agent_class("tests.controller.agents.NoRun")


def test_run_agent_exit_codes() -> None:
    class Ok:
        def run(self) -> None:
            pass

    class Async:
        async def run(self) -> None:
            raise SystemExit(4)

    class Raises:
        def run(self) -> None:
            raise ValueError("x")

    assert run_agent(Ok) == 0
    assert run_agent(Async) == 4
    assert run_agent(Raises) == 1


# --- exits, names, attempts --------------------------------------------------------------


def test_classify_exit() -> None:
    assert classify_exit(0, "").succeeded
    failed = classify_exit(2, "line")
    assert (
        not failed.succeeded
        and not failed.retryable
        and failed.message == "agent exited with code 2; last output:\nline"
    )
    oom = classify_exit(-signal.SIGKILL, "")
    assert oom.retryable and "SIGKILL, which the controller did not send" in (oom.message or "")
    segv = classify_exit(-signal.SIGSEGV, "")
    assert not segv.retryable and "crashed (SIGSEGV)" in (segv.message or "")
    assert classify_exit(None, "").retryable
    # the outcome each is recorded as (docs/reliability.md): the agent's own failure, or a loss
    kinds = [classify_exit(code, "").kind for code in (2, -signal.SIGSEGV, -signal.SIGKILL, None)]
    assert kinds == ["agent_error", "agent_error", "sandbox_lost", "sandbox_lost"]
    assert classify_exit(0, "").kind is None  # a success: the Gateway judges it by its reward


def test_safe_names_cannot_escape_the_log_directory() -> None:
    assert safe_name("attempt-1-abc") == "attempt-1-abc"
    for evil in ("..", ".", ".hidden", "a/b", "a\\b", "x" * 300):
        name = safe_name(evil)
        assert "/" not in name and not name.startswith(".") and len(name) <= 120
        assert (Path("/logs") / name).parent == Path("/logs")
    assert safe_name("a:b") != safe_name("a;b")  # cleaned names stay distinct


def test_attempt_ids_carry_their_number() -> None:
    assert attempt_number(new_attempt_id(3)) == 3
    assert new_attempt_id(1) != new_attempt_id(1)
    assert attempt_number("v1-controller-uuid") == 1 and attempt_number(None) == 1


# --- config ------------------------------------------------------------------------------


def test_default_config_has_the_v1_keys() -> None:
    config = load_controller_config(load_cli_config("controller", [], prog="agl-controller"))
    assert config.runner_type == "local" and config.max_attempts == 1
    assert config.agl_server.url == "http://127.0.0.1:8080" and config.agl_server.agent_url == ""
    assert config.local_runner.maximum_size == 50 and config.local_runner.poll_interval == 1.0
    k8s = config.k8s_runner
    assert (k8s.namespace, k8s.ttl_after_finished, k8s.max_jobs_per_minute, k8s.poll_interval) == (
        "default",
        1200,
        100,
        5.0,
    )


def test_dotted_overrides_and_config_file(tmp_path: Path) -> None:
    file = tmp_path / "c.yaml"
    file.write_text("runner_type: k8s\nk8s_runner:\n  namespace: agents\n  max_jobs_per_minute: 5\n")
    cfg = load_cli_config("controller", ["--config", str(file), "k8s_runner.max_jobs_per_minute=9"], prog="x")
    config = load_controller_config(cfg)
    assert config.runner_type == "k8s" and config.k8s_runner.namespace == "agents"
    assert config.k8s_runner.max_jobs_per_minute == 9 and config.poll_interval == 5.0


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("runner_type=docker", "runner_type must be one of local, k8s"),
        ("max_attempts=0", "max_attempts must be at least 1"),
        ("local_runner.maximum_size=0", "local_runner.maximum_size"),
        ("agl_server.url=localhost:8181", "agl_server.url must be an http(s) URL"),
        ("k8s_runner.ttl_after_finished=-5", "k8s_runner.ttl_after_finished"),
    ],
)
def test_bad_values_are_named(override: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", "\\(").replace(")", "\\)")):
        load_controller_config(load_cli_config("controller", [override], prog="x"))


def test_unknown_keys_and_wrong_types_fail(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match=r"^local_runner\.no_such_key: not a key of local_runner$"):
        load_controller_config({"local_runner": {"no_such_key": 1}})
    with pytest.raises(
        ConfigError, match=r"^local_runner\.maximum_sise: .*\(did you mean local_runner\.maximum_size\?\)"
    ):
        load_controller_config({"local_runner": {"maximum_sise": 1}})
    with pytest.raises(ConfigError, match=r"^local_runner\.maximum_size: .*many"):
        load_controller_config({"local_runner": {"maximum_size": "many"}})
    for override, named in (
        ("local_runner.no_such_key=1", "no_such_key"),
        ("local_runner.maximum_size=many", "maximum_size"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            cli.main([override])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert "agl-controller: bad config" in err and named in err


def test_help_lists_every_key(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    for key in (
        "runner_type",
        "agent_url",
        "maximum_size",
        "max_jobs_per_minute",
        "ttl_after_finished",
        "warm_start",
    ):
        assert key in out


async def test_spawn_failure_is_an_infrastructure_failure(tmp_path: Path) -> None:
    from agentlightning.controller.local import LocalRunner
    from agentlightning.controller.runner import LaunchError

    config = load_controller_config(
        {
            "local_runner": {
                "python": str(tmp_path / "no-python"),
                "warm_start": False,
                "log_dir": str(tmp_path),
            }
        }
    )
    runner = LocalRunner(config)
    await runner.start()
    with pytest.raises(LaunchError) as failure:
        await runner.launch(rollout({}, {}), "attempt-1-x")
    assert failure.value.retryable and "could not start the agent process" in failure.value.message
    await runner.close()
