"""Run an agent's commands in a bubblewrap sandbox: its workspace, read-only system files, nothing else.

What a command inside sees:
  * `workspace` read-write at `mount_at` (default `/workspace`), its working directory;
  * `/usr` (and the `/bin`, `/lib*`, `/sbin` links or folders), a few `/etc` files the dynamic
    loader and `getpwuid` need, and the `read_only` paths (e.g. a Python prefix) at their own paths,
    all read-only; the `read_write` paths at their own paths, writable; the `mounts` (a harness's
    home) writable at the path inside each is given, so that no host path (a temporary folder's
    random name) shows inside, in what the agent reads or sends the model;
  * a private `/tmp`, `/dev` and `/proc`; no network at all (its own loopback only, so even
    servers on the host's loopback are out of reach) unless `network=True`;
  * its own PID namespace: it cannot see or signal processes outside, and when the command ends
    or is killed, every process it started goes with it (the namespace's init dies); a sandboxed
    process's `wait` returns only once that namespace is gone, so nothing it started outlives it;
  * only the environment given in `env` (plus PATH, HOME, LANG): bwrap itself starts with none,
    so not even `/proc/1/environ` shows what the caller holds.

    box = Sandbox(workspace=Path("ws"), read_only=python_paths(sys.executable))
    result = box.run(["python", "-m", "pytest", "-q"], timeout=60)

Needs Debian's `bubblewrap` (`bwrap` on PATH); `available()` says whether it is there.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

__all__ = ["Sandbox", "SandboxProcess", "SandboxResult", "SandboxUnavailable", "available", "python_paths"]

# /etc files that ordinary programs read (the loader's cache, user and group names, locale data).
_ETC_FILES = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "passwd",
    "group",
    "nsswitch.conf",
    "localtime",
    "mime.types",
)
_TOP_LEVEL = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


class SandboxUnavailable(RuntimeError):
    """bubblewrap is not installed (`apt-get install -y bubblewrap`)."""


@cache
def available() -> bool:
    """True when `bwrap` is on PATH and can create its namespaces here."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return False
    probe = subprocess.run(
        [bwrap, "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "true"],
        capture_output=True,
        timeout=30,
    )
    return probe.returncode == 0


def python_paths(python: str) -> tuple[Path, ...]:
    """The folders a Python interpreter needs to run (its venv and the base install), resolved."""
    out = subprocess.run(
        [python, "-c", "import sys; print(sys.prefix); print(sys.base_prefix)"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout.split()
    paths = {Path(p).resolve() for p in out}
    # A venv's python is a link into the base install, and the venv folder may itself be reached
    # through a link (the path the caller runs must exist inside too: Sandbox binds both).
    paths.add(Path(python).absolute().parent.parent)
    return tuple(sorted(p for p in paths if not str(p).startswith("/usr")))


@dataclass(frozen=True)
class SandboxResult:
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool


@dataclass(frozen=True)
class Sandbox:
    workspace: Path
    mount_at: str = "/workspace"
    read_only: Sequence[Path] = ()
    read_write: Sequence[Path] = ()
    mounts: Mapping[str, Path] = field(default_factory=dict)  # path inside -> host folder, writable
    env: Mapping[str, str] = field(default_factory=dict)
    network: bool = False
    path: str = "/usr/local/bin:/usr/bin:/bin"

    def argv(self, command: Sequence[str], *, info_fd: int | None = None) -> list[str]:
        """The bwrap command line that runs `command` inside this sandbox.

        `info_fd`: where bwrap writes its JSON (the namespace's init as `child-pid`) and closes.
        """
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise SandboxUnavailable(
                "bwrap not found: install Debian's bubblewrap (apt-get install -y bubblewrap)"
            )
        workspace = Path(self.workspace).resolve()
        if not workspace.is_dir():
            raise FileNotFoundError(f"sandbox workspace {workspace} is not a folder")
        # bwrap starts with an empty environment (`env -i`): inside the PID namespace its own
        # process is PID 1, and `/proc/1/environ` would show a command whatever the caller holds
        # (the attempt's key, a reference answer); `--clearenv` cleans only the command's.
        # The private /tmp first: binds that come after it (a venv under /tmp) mount inside it.
        args = ["/usr/bin/env", "-i", bwrap, "--ro-bind", "/usr", "/usr", "--tmpfs", "/tmp"]
        for name in _TOP_LEVEL:
            top = Path("/", name)
            if top.is_symlink():
                args += ["--symlink", os.readlink(top), str(top)]
            elif top.is_dir():
                args += ["--ro-bind", str(top), str(top)]
        for name in _ETC_FILES:
            if Path("/etc", name).exists():
                args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
        for flag, paths in (("--ro-bind", self.read_only), ("--bind", self.read_write)):
            for extra in paths:
                real = Path(extra).resolve()
                args += [flag, str(real), str(real)]
                if Path(extra).absolute() != real:  # a symlinked venv: keep its own path working too
                    args += [flag, str(real), str(Path(extra).absolute())]
        for inside, host in self.mounts.items():
            args += ["--bind", str(Path(host).resolve()), inside]
        args += [
            "--dev", "/dev",
            "--proc", "/proc",
            "--bind", str(workspace), self.mount_at,
            "--chdir", self.mount_at,
            "--unshare-all",
            *(["--share-net"] if self.network else []),
            "--die-with-parent",
            "--new-session",
            "--clearenv",
            "--setenv", "PATH", self.path,
            "--setenv", "HOME", "/tmp",
            "--setenv", "LANG", "C.UTF-8",
        ]  # fmt: skip
        for key, value in self.env.items():
            args += ["--setenv", key, value]
        if info_fd is not None:
            args += ["--info-fd", str(info_fd)]
        return [*args, "--", *command]

    def popen(self, command: Sequence[str], **kwargs) -> SandboxProcess:
        """Start `command` in the sandbox, in its own process group (see `kill`)."""
        read_end, write_end = os.pipe()
        try:
            proc = SandboxProcess(
                self.argv(command, info_fd=write_end), start_new_session=True, pass_fds=(write_end,), **kwargs
            )
        finally:
            os.close(write_end)
        with open(read_end, "rb") as info:  # written once the namespace exists, then closed by bwrap
            proc.watch_namespace(info.read())
        return proc

    def run(self, command: Sequence[str], *, timeout: float, input: str | None = None) -> SandboxResult:
        """Run `command` to its end or `timeout` seconds; on timeout everything it started is killed."""
        proc = self.popen(
            command,
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            stdout, stderr = proc.communicate(input, timeout=timeout)
            return SandboxResult(proc.returncode, stdout, stderr, timed_out=False)
        except subprocess.TimeoutExpired:
            kill(proc)
            stdout, stderr = proc.communicate()
            return SandboxResult(proc.returncode, stdout or "", stderr or "", timed_out=True)


class SandboxProcess(subprocess.Popen):
    """bwrap running a command, whose `wait` also waits for the command's PID namespace to go.

    bwrap exits as soon as the command does (its init reports the exit status first), while the
    kernel is still killing what the command left running; without this, `run` could return with
    a background child of the command still alive for a moment.
    """

    _init: int | None = None  # a pidfd of the namespace's init, until it has exited

    def watch_namespace(self, info: bytes) -> None:
        """Follow the namespace's init that bwrap's `--info-fd` JSON names (nothing if it names none)."""
        try:
            fields = json.loads(info)
            pid, namespace = int(fields["child-pid"]), int(fields["pid-namespace"])
        except (ValueError, KeyError, TypeError):
            return  # bwrap failed before creating it: its own exit status says why
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            return  # already gone, and its namespace with it
        # The pid may have been reaped and reused already; only the namespace's own init counts.
        try:
            ours = os.readlink(f"/proc/{pid}/ns/pid") == f"pid:[{namespace}]"
        except OSError:
            ours = False
        if ours:
            self._init = pidfd
        else:
            os.close(pidfd)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        code = super().wait(timeout)
        if self._init is not None:
            # The init's pidfd turns readable when it exits, which the kernel lets happen only
            # after every other process of its namespace has exited.
            # (poll, not select: a busy caller's descriptors may be numbered past select's 1024)
            waiter = select.poll()
            waiter.register(self._init, select.POLLIN)
            left = None if deadline is None else max(0.0, deadline - time.monotonic()) * 1000
            if not waiter.poll(left):
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            os.close(self._init)
            self._init = None
        return code

    def __del__(self) -> None:
        if self._init is not None:  # never waited for
            os.close(self._init)
            self._init = None
        super().__del__()


def kill(proc: subprocess.Popen) -> None:
    """Kill a sandboxed command: bwrap's process group; its PID namespace takes every child with it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
