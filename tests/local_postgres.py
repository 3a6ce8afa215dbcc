"""A throwaway PostgreSQL server for tests and benchmarks: `initdb` in a temporary folder, a free
loopback port, stopped by its process id. No system service is used or assumed.

Debian's binaries live in /usr/lib/postgresql/<version>/bin (not on PATH). `initdb` and
`postgres` refuse to run as root, so as root both run as the `postgres` user (which Debian's
package creates) through `setpriv`, and the folder is handed to that user.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from agentlightning.procs import free_port

PG_USER = "postgres"  # the database role the server is initialised with


def find_bin_dir() -> Path | None:
    """The folder holding initdb, postgres and psql: $AGL_PG_BIN, Debian's newest version, or PATH."""
    configured = os.environ.get("AGL_PG_BIN")
    if configured:
        return Path(configured)
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("initdb")  # resolved: a link on PATH may point into the real folder
    return Path(on_path).resolve().parent if on_path else None


class LocalPostgres:
    """One Postgres server of our own. `start()`, `url(db)`, `create_database(db)`, `stop()`;
    `kill()` and `start()` again restart it on the same port and data (failure tests)."""

    def __init__(self, bin_dir: Path | None = None, port: int | None = None, fsync: bool = True) -> None:
        bin_dir = bin_dir or find_bin_dir()
        if bin_dir is None:
            raise FileNotFoundError("no PostgreSQL server binaries: install Debian's postgresql package")
        self.bin_dir = bin_dir
        self.port = port or free_port()
        # fsync=False (tests): a crash of Postgres still loses nothing committed, only a crash
        # of the whole machine would; what the benchmarks measure keeps it on.
        self.fsync = fsync
        self.root = Path(tempfile.mkdtemp(prefix="agl-pg-"))
        self.data = self.root / "data"
        self.log_path = self.root / "postgres.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self.root.chmod(0o700)
            self._as_user = [
                "setpriv",
                f"--reuid={user.pw_uid}",
                f"--regid={user.pw_gid}",
                "--clear-groups",
                "--",
            ]
        self._initdb()

    def _run(self, *argv: str) -> None:
        result = subprocess.run(
            [*self._as_user, *argv], capture_output=True, text=True, check=False, cwd=self.root
        )
        if result.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed ({result.returncode}): {result.stderr or result.stdout}")

    def _initdb(self) -> None:
        self._run(
            str(self.bin_dir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            PG_USER,
            "--auth=trust",
            "--encoding=UTF8",
            "--no-sync",
        )

    def start(self, timeout: float = 30.0) -> LocalPostgres:
        argv = [
            *self._as_user,
            str(self.bin_dir / "postgres"),
            "-D",
            str(self.data),
            "-p",
            str(self.port),
            "-h",
            "127.0.0.1",
            "-k",
            str(self.root),  # the Unix socket goes here, not to /var/run/postgresql
            "-c",
            "max_connections=300",
            "-c",
            "shared_buffers=64MB",
            "-c",
            f"fsync={'on' if self.fsync else 'off'}",
        ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.root, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited ({self.proc.returncode}):\n{self.log_tail()}")
            ready = subprocess.run(
                [str(self.bin_dir / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-q"],
                check=False,
            )
            if ready.returncode == 0:
                return self
            time.sleep(0.1)
        raise TimeoutError(f"postgres did not accept connections within {timeout} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{PG_USER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """A new empty database; its URL."""
        self._run(
            str(self.bin_dir / "psql"),
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-U",
            PG_USER,
            "-d",
            "postgres",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            f'CREATE DATABASE "{name}"',
        )
        return self.url(name)

    def _wait(self, timeout: float) -> None:
        assert self.proc is not None
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self, timeout: float = 20.0) -> None:
        """Fast shutdown (SIGINT): open transactions are rolled back, committed data kept."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGINT)
            self._wait(timeout)
        self.proc = None

    def kill(self) -> None:
        """Immediate shutdown (SIGQUIT: no checkpoint, crash recovery at the next start)."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGQUIT)
            self._wait(20.0)
        self.proc = None

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
