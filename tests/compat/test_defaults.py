"""Our defaults against v1.0.2's, for every key v1.0 has: the same value unless listed here with
the reason (docs/gateway.md and docs/controller.md say it too)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from omegaconf import OmegaConf

from agentlightning.config.loader import load_cli_config
from agentlightning.controller.config import load_controller_config
from agentlightning.server.config import load_server_config

DELIBERATE = {
    "server": {
        # loopback: a Gateway started without a key is not reachable from the network
        "host": ("0.0.0.0", "127.0.0.1"),
        # the name the trainer registers its endpoints under, whatever model it trains
        "default_proxy.model_name": ("Qwen/Qwen2.5-7B-Instruct", "policy"),
    },
    "controller": {
        # a bare agl-controller runs without a cluster or the k8s extra
        "runner_type": ("k8s", "local"),
        # the same address; localhost may resolve to ::1 where the Gateway listens on 127.0.0.1
        "agl_server.url": ("http://localhost:8080", "http://127.0.0.1:8080"),
        # a rollout does not wait up to 10 s to start (one cheap read a second)
        "local_runner.poll_interval": (10, 1.0),
    },
}


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def v1_config(v1_bin: Path, name: str) -> dict[str, Any]:
    [path] = (v1_bin.parent / "lib").glob(f"python*/site-packages/agentlightning/config/{name}.yaml")
    return flatten(yaml.safe_load(path.read_text()))


@pytest.mark.parametrize("name", ["server", "controller"])
def test_v1_keys_keep_v1_defaults(v1_bin: Path, name: str) -> None:
    cfg = load_cli_config(name, [], prog=f"agl-{name}")
    loaded = load_server_config(cfg) if name == "server" else load_controller_config(cfg)
    ours = flatten(OmegaConf.to_container(OmegaConf.structured(loaded)))  # type: ignore[arg-type]
    theirs = v1_config(v1_bin, name)
    assert len(theirs) >= 8
    differences = {}
    for key, value in theirs.items():
        assert key in ours, f"v1.0's key {key} is missing"
        if ours[key] != value and not (value is None and ours[key] == ""):
            differences[key] = (value, ours[key])
    assert differences == DELIBERATE[name]
