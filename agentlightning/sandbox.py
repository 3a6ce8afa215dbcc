"""Run an agent's commands in a bubblewrap sandbox: its workspace, read-only system files, nothing else.

What a command inside sees:
  * `workspace` read-write at `mount_at` (default `/workspace`), its working directory;
  * `/usr` (and the `/bin`, `/lib*`, `/sbin` links or folders), a few `/etc` files the dynamic
    loader and `getpwuid` need, and the `read_only` paths (e.g. a Python prefix) at their own paths,
    all read-only;
  * a private `/tmp`, `/dev` and `/proc`; no network at all (its own loopback only, so even
    servers on the host's loopback are out of reach) unless `network=True`;
  * its own PID namespace: it cannot see or signal processes outside, and when the command ends
    or is killed, every process it started goes with it (the namespace's init dies);
  * only the environment given in `env` (plus PATH, HOME, LANG): bwrap itself starts with none,
    so not even `/proc/1/environ` shows what the caller holds.

    box = Sandbox(workspace=Path("ws"), read_only=python_paths(sys.executable))
    result = box.run(["python", "-m", "pytest", "-q"], timeout=60)

Needs Debian's `bubblewrap` (`bwrap` on PATH); `available()` says whether it is there.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

__all__ = ["Sandbox", "SandboxResult", "SandboxUnavailable", "available", "python_paths"]

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
    env: Mapping[str, str] = field(default_factory=dict)
    network: bool = False
    path: str = "/usr/local/bin:/usr/bin:/bin"

    def argv(self, command: Sequence[str]) -> list[str]:
        """The bwrap command line that runs `command` inside this sandbox."""
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
        for extra in self.read_only:
            real = Path(extra).resolve()
            args += ["--ro-bind", str(real), str(real)]
            if Path(extra).absolute() != real:  # a symlinked venv: keep its own path working too
                args += ["--ro-bind", str(real), str(Path(extra).absolute())]
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
        return [*args, "--", *command]

    def popen(self, command: Sequence[str], **kwargs) -> subprocess.Popen:
        """Start `command` in the sandbox, in its own process group (see `kill`)."""
        return subprocess.Popen(self.argv(command), start_new_session=True, **kwargs)

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


def kill(proc: subprocess.Popen) -> None:
    """Kill a sandboxed command: bwrap's process group; its PID namespace takes every child with it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
