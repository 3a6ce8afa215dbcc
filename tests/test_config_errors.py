"""Config errors of every command line name the key and, for a misspelt one, the closest key it
has (`config/loader.py`, `config/suggest.py`): one line, never OmegaConf's raw text."""

from __future__ import annotations

import pytest

from agentlightning.config.suggest import did_you_mean
from agentlightning.controller import cli as controller_cli
from agentlightning.server import cli as server_cli


@pytest.mark.parametrize(
    ("main", "override", "message"),
    [
        (
            controller_cli.main,
            "agl_server.ur=http://x",
            "agl-controller: bad config: agl_server.ur: not a key of agl_server (did you mean agl_server.url?); "
            "`agl-controller --help` lists every key",
        ),
        (
            controller_cli.main,
            "local_runner.maximum_size=many",
            "agl-controller: bad config: local_runner.maximum_size: Value 'many' of type 'str' could not "
            "be converted to Integer",
        ),
        (
            server_cli.main,
            "prot=9000",
            "agl-server: bad config: prot: not a key of the config (did you mean port?); `agl-server --help` lists every key",
        ),
        (
            server_cli.main,
            "defualt_proxy.model_name=m",
            "agl-server: bad config: defualt_proxy: not a key of the config (did you mean default_proxy?); "
            "`agl-server --help` lists every key",
        ),
        (
            server_cli.main,
            "port=abc",
            "agl-server: bad config: port: Value 'abc' of type 'str' could not be converted to Integer",
        ),
    ],
)
def test_a_bad_key_or_value_is_one_line_naming_it(
    main: object, override: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([override])  # type: ignore[operator]
    assert exit_.value.code == 2
    assert capsys.readouterr().err == message + "\n"


@pytest.mark.parametrize(
    ("key", "meant"),
    [
        (
            "agentlightning.locl.agent_class",
            "agentlightning.local.agent_class",
        ),  # the wrong segment is matched
        ("agentlightning.locl", "agentlightning.local"),
        ("data.train_batch_szie", "data.train_batch_size"),
        ("trian", "train"),
    ],
)
def test_did_you_mean_matches_the_first_wrong_segment(key: str, meant: str) -> None:
    known = {
        "agentlightning.local.agent_class",
        "agentlightning.local.env_map",
        "agentlightning.hooks",
        "data.train_batch_size",
        "data.train_files",
        "train",
        "init",
    }
    assert did_you_mean(key, known) == f" (did you mean {meant}?)"
    assert did_you_mean("zzz.qqq", known) == ""
