"""Start and stop our own child processes by their id (never by name), with their logs on disk."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx


def free_port(host: str = "127.0.0.1") -> int:
    """A loopback port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def descendants(pid: int) -> dict[int, str]:
    """The processes below `pid` (children, theirs, ...), each with its name (/proc/PID/comm)."""
    children: dict[int, list[int]] = {}
    name_of: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # gone meanwhile
            continue
        close = stat.rindex(")")  # the name, in parentheses, may hold spaces and parentheses
        name_of[int(entry)] = stat[stat.index("(") + 1 : close]
        children.setdefault(int(stat[close + 2 :].split()[1]), []).append(int(entry))
    found: dict[int, str] = {}
    below = [pid]
    while below:
        for child in children.get(below.pop(), ()):
            found[child] = name_of[child]
            below.append(child)
    return found


class ProcessFailed(RuntimeError):
    pass


class ManagedProcess:
    """A child in its own process group, so that stopping it also stops what it started."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: str | os.PathLike[str] | None,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = Path(log_path) if log_path is not None else None  # None: the caller's stdout/stderr
        self.env = dict(os.environ if env is None else env)
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} was not started"
        return self.proc.pid

    def start(self) -> ManagedProcess:
        if self.log_path is None:
            self.proc = self._popen(None, None)
            return self
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = self._popen(log, subprocess.STDOUT)
        return self

    def _popen(self, stdout: Any, stderr: Any) -> subprocess.Popen[bytes]:
        # A new session: the terminal's Ctrl-C reaches only the parent, which stops us in order.
        return subprocess.Popen(
            self.argv,
            stdout=stdout,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            env=self.env,
            cwd=self.cwd,
            start_new_session=True,
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        if self.log_path is None:
            return ""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def wait_http_ok(self, url: str, timeout: float = 30.0, verify: ssl.SSLContext | bool = True) -> None:
        """Wait until GET url answers 200; fail early, with the log's tail, if the process exits.
        `verify`: for an https URL, what to trust (e.g. a context with a private CA)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise ProcessFailed(
                    f"{self.name} exited with {self.proc and self.proc.returncode}:\n{self.log_tail()}"
                )
            try:
                if httpx.get(url, timeout=1.0, trust_env=False, verify=verify).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise ProcessFailed(f"{self.name} did not answer {url} within {timeout:.0f}s:\n{self.log_tail()}")

    def signal_group(self, sig: int) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """SIGKILL the whole group at once: a crash, for tests."""
        self.signal_group(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM the group, then SIGKILL what is left after `timeout` seconds."""
        if self.proc is None:
            return None
        self.signal_group(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.signal_group(signal.SIGKILL)
            self.proc.wait()
        # The leader is gone; make sure nothing it started outlives it.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        return self.proc.returncode
