"""The Gateway's and the Controller's shipped YAML (what `--help` prints, what a user copies) hold
exactly the keys of their schemas, at the schemas' defaults: a default is written once, checked
here, and a key the schema reads is never missing from the file (`agl-server store.pool_size=5`
was refused while the docs named it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

import agentlightning.config
from agentlightning.controller.config import ControllerConfig
from agentlightning.server.config import ServerConfig

CONFIG_DIR = Path(agentlightning.config.__file__).parent


def differences(schema: dict[Any, Any], shipped: dict[Any, Any], prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(schema) | set(shipped)):
        name = f"{prefix}{key}"
        if key not in shipped:
            out.append(f"{name}: in the schema, not in the file")
        elif key not in schema:
            out.append(f"{name}: in the file, not in the schema")
        elif isinstance(schema[key], dict) and isinstance(shipped[key], dict):
            out += differences(schema[key], shipped[key], f"{name}.")
        elif schema[key] != shipped[key]:
            out.append(f"{name}: the file says {shipped[key]!r}, the schema {schema[key]!r}")
    return out


@pytest.mark.parametrize(("name", "schema"), [("server", ServerConfig), ("controller", ControllerConfig)])
def test_the_shipped_yaml_is_the_schema_at_its_defaults(name: str, schema: type) -> None:
    shipped = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / f"{name}.yaml"), resolve=False)
    defaults = OmegaConf.to_container(OmegaConf.structured(schema), resolve=False)
    assert isinstance(shipped, dict) and isinstance(defaults, dict)
    assert differences(defaults, shipped) == []
