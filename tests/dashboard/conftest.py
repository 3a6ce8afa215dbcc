"""The browser the dashboard tests drive: the OS's Chromium through Playwright.

Nothing is downloaded (never `playwright install`): the test uses Debian's `chromium` package.
Where no Chromium binary exists the browser tests skip saying so — except on CI (`CI` set),
where they fail: `.ci/run` installs Chromium from the OS packages.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM_FLAGS = [
    "--no-sandbox",  # root in containers and CI
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",  # containers' small /dev/shm would crash the renderer
]


def chromium_path() -> str | None:
    for candidate in (os.environ.get("AGL_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI must run the browser tests: .ci/run installs Debian's chromium)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    path = chromium_path()
    if path is None:
        _unavailable("no Chromium binary (apt-get install chromium, or set AGL_CHROMIUM=/path/to/chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("the playwright package is not installed (pip install -e '.[dev]')")
    with tempfile.TemporaryDirectory(prefix="agl-chromium-") as profile, sync_playwright() as p:
        # A persistent context on a fresh profile directory: nothing from another run leaks in.
        context = p.chromium.launch_persistent_context(
            profile,
            executable_path=path,
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1400, "height": 900},
        )
        try:
            yield context
        finally:
            context.close()
