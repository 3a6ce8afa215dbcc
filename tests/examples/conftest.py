"""The examples' tests run the agents in `.venv-examples` (created by `make`): without it they
skip with the reason, except on CI (`CI` set), where they must run and so fail."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.examples.stack import EXAMPLES_PYTHON


@pytest.fixture(scope="session")
def examples_python() -> str:
    if not EXAMPLES_PYTHON.exists():
        reason = f"{EXAMPLES_PYTHON} is missing: run `make examples-venv`"
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (required on CI)")
        pytest.skip(reason)
    return str(EXAMPLES_PYTHON)


@pytest.fixture(scope="session")
def java() -> str:
    """ScienceWorld's simulator runs on Java (Debian's default-jre-headless; .ci/run installs it)."""
    path = shutil.which("java")
    if path is None:
        reason = "no `java` on PATH: apt-get install default-jre-headless (ScienceWorld's simulator)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (required on CI)")
        pytest.skip(reason)
    return path
