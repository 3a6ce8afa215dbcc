"""CPU-seconds per test, the processes it starts included: where CI's time goes.

On a busy 2-core machine a test's wall time mostly measures its wait for a core (CI's `test_ray`:
112-191 s of wall, 38 CPU-s alone), so CI is shortened by cutting CPU-seconds, and these are
what this plugin reports:

    AGL_CPU_PROFILE=1 pytest -p tests.cpu_profile ...     (the Makefile's test targets load it)

Each pytest process that runs tests (each xdist worker) moves itself into a cgroup of its own
(cgroup v1 `cpuacct`, or v2's `cpu.stat`; root only), so every process a test starts is counted,
however it detaches. A test's figure runs from its set-up to its teardown: the first test on a
session fixture (the session's vLLM server) carries its start. The summary lists the tests with
the most CPU. Without AGL_CPU_PROFILE the plugin does nothing; where no cgroup can be made it
says why and does nothing.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

CGROUPS = (Path("/sys/fs/cgroup/cpuacct"), Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))
SHOWN = 25


class CpuMeter:
    """CPU time of every process in a cgroup this process made and moved itself into."""

    def __init__(self) -> None:
        self.group: Path | None = None
        self.why_not = ""
        self.started: dict[str, float] = {}
        self.figures: dict[str, float] = {}

    def join(self) -> None:
        name = f"agl-cpu-profile-{os.getpid()}"
        for root in CGROUPS:
            usage = "cpuacct.usage" if root.name == "cpuacct" else "cpu.stat"
            if not (root / usage).exists() and not (root / "cgroup.procs").exists():
                continue
            try:
                group = root / name
                group.mkdir(exist_ok=True)
                (group / "cgroup.procs").write_text(str(os.getpid()))
                self.group = group
                self.read()
                return
            except OSError as exc:
                self.why_not = f"{root}: {exc}"
        self.why_not = self.why_not or "no cgroup hierarchy found under /sys/fs/cgroup"

    def read(self) -> float:
        """The group's CPU-seconds so far."""
        assert self.group is not None
        if (self.group / "cpuacct.usage").exists():
            return int((self.group / "cpuacct.usage").read_text()) / 1e9
        stat = dict(line.split() for line in (self.group / "cpu.stat").read_text().splitlines())
        return int(stat["usage_usec"]) / 1e6

    def leave(self) -> None:
        """Back to the parent group; the group goes once its last process has."""
        if self.group is None:
            return
        try:
            (self.group.parent / "cgroup.procs").write_text(str(os.getpid()))
            self.group.rmdir()
        except OSError:
            pass  # a process a test left behind still runs in it


METER = CpuMeter()


def enabled(config: pytest.Config) -> bool:
    return bool(os.environ.get("AGL_CPU_PROFILE")) and not config.getoption("collectonly", False)


def pytest_configure(config: pytest.Config) -> None:
    runs_tests = not config.pluginmanager.hasplugin("dsession")  # an xdist controller runs none
    if enabled(config) and runs_tests:
        METER.join()


def pytest_unconfigure(config: pytest.Config) -> None:
    METER.leave()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if METER.group is not None:
        METER.started[item.nodeid] = METER.read()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    if call.when == "teardown" and item.nodeid in METER.started:
        seconds = METER.read() - METER.started.pop(item.nodeid)
        outcome.get_result().user_properties.append(("cpu_s", round(seconds, 2)))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """In the process that reports (with xdist: the controller, the figure sent by its worker)."""
    if report.when == "teardown":
        for key, value in report.user_properties:
            if key == "cpu_s" and isinstance(value, float):
                METER.figures[report.nodeid] = value


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if not enabled(config):
        return
    if not METER.figures:
        reason = METER.why_not or "no test reported a figure"
        terminalreporter.write_line(f"AGL_CPU_PROFILE: no CPU figures ({reason})")
        return
    ranked = sorted(METER.figures.items(), key=lambda kv: kv[1], reverse=True)
    total = sum(METER.figures.values())
    terminalreporter.write_sep("=", f"most CPU-seconds (children included): {total:.0f} s in all tests")
    for nodeid, seconds in ranked[:SHOWN]:
        terminalreporter.write_line(f"{seconds:8.1f}s  {nodeid}")
