"""A heavy part (a venv, an npm prefix, a Debian package) that a test needs: missing here, the test
skips saying what to install; missing on CI (`CI` set), it fails, so nothing heavy goes untested."""

from __future__ import annotations

import os

import pytest


def require(missing: object) -> None:
    """Skip (or, on CI, fail) naming what is `missing`; nothing when it is empty."""
    if not missing:
        return
    if os.environ.get("CI"):
        pytest.fail(f"required on CI: {missing}")
    pytest.skip(f"missing: {missing}")
