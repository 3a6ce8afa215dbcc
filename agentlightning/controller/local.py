"""Local runner: each attempt is its own process in its own process group, started from a warm
fork server when the agent class can be preloaded, else from a fresh interpreter.

Per attempt, under `log_dir/{rollout}/`: `{attempt}.log` (the agent's stdout and stderr),
`{attempt}.pid` (pid, start time, deadline: lets a restarted controller find the process again)
and `{attempt}.exit` (the exit code, written by the agent process itself as it ends).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson

from agentlightning.controller.bootstrap import AgentClassError, parse_agent_class
from agentlightning.controller.config import ControllerConfig
from agentlightning.controller.env import EnvMapError, agent_env
from agentlightning.controller.log_retention import LogRetention
from agentlightning.controller.runner import Handle, LaunchError, Outcome, Runner
from agentlightning.controller.warm import SpawnFailed, WarmPool
from agentlightning.log import get_logger
from agentlightning.schemas import AttemptOutcome, Rollout

log = get_logger("controller.local")

# Signals a process raises on itself when it crashes: the agent's own failure, not retried.
CRASH_SIGNALS = frozenset(
    {
        signal.SIGSEGV,
        signal.SIGABRT,
        signal.SIGBUS,
        signal.SIGFPE,
        signal.SIGILL,
        signal.SIGSYS,
        signal.SIGTRAP,
    }
)
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def safe_name(value: str) -> str:
    """An id as a file name: kept when harmless, else cleaned and suffixed with a hash."""
    cleaned = _SAFE.sub("_", value)[:100]
    if cleaned != value or cleaned.startswith("."):
        cleaned = f"{cleaned.lstrip('.')[:100]}-{hashlib.sha256(value.encode()).hexdigest()[:10]}"
    return cleaned


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), to tell it from a reused pid;
    None when it does not exist or has exited (a zombie nobody reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    try:
        fields = stat[stat.rindex(b")") + 2 :].split()
        return None if fields[0] in (b"Z", b"X") else int(fields[19])
    except (ValueError, IndexError):
        return None


def tail_lines(path: Path, lines: int, max_bytes: int = 8192) -> str:
    if lines <= 0:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace").rstrip()
    return "\n".join(text.splitlines()[-lines:])


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def classify_exit(returncode: int | None, output_tail: str) -> Outcome:
    """An agent process's end as an Outcome. `returncode` follows asyncio: negative = killed by
    that signal, None = unknown (the process ended while nobody could see how)."""
    tail = f"; last output:\n{output_tail}" if output_tail else ""
    if returncode == 0:
        return Outcome.success()
    if returncode is None:
        return Outcome.failure(
            "the agent process ended without recording an exit code (killed while the controller "
            "was not watching it?)" + tail,
            retryable=True,
            kind=AttemptOutcome.SANDBOX_LOST,
        )
    if returncode > 0:
        return Outcome.failure(f"agent exited with code {returncode}{tail}", kind=AttemptOutcome.AGENT_ERROR)
    name = _signal_name(-returncode)
    if -returncode in CRASH_SIGNALS:
        return Outcome.failure(f"agent crashed ({name}){tail}", kind=AttemptOutcome.AGENT_ERROR)
    # SIGKILL from the kernel's OOM killer (a memory limit) lands here, as any signal from outside.
    return Outcome.failure(
        f"agent was killed by {name}, which the controller did not send (out of memory? an operator?){tail}",
        retryable=True,
        kind=AttemptOutcome.SANDBOX_LOST,
    )


class AttemptFiles:
    def __init__(self, log_dir: Path, rollout_id: str, attempt_id: str) -> None:
        self.dir = log_dir / safe_name(rollout_id)
        stem = safe_name(attempt_id)
        self.log = self.dir / f"{stem}.log"
        self.pid = self.dir / f"{stem}.pid"
        self.exit = self.dir / f"{stem}.exit"

    def read_exit_code(self) -> int | None:
        try:
            return int(orjson.loads(self.exit.read_bytes())["exit_code"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def write_pid(self, pid: int, ticks: int | None, deadline: float) -> None:
        tmp = self.pid.with_suffix(".pid.tmp")
        tmp.write_bytes(orjson.dumps({"pid": pid, "start_ticks": ticks, "deadline": deadline}))
        os.replace(tmp, self.pid)

    def read_pid(self) -> dict[str, Any] | None:
        try:
            data = orjson.loads(self.pid.read_bytes())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) and isinstance(data.get("pid"), int) else None

    def forget(self) -> None:
        for path in (self.pid, self.exit):
            with contextlib.suppress(OSError):
                path.unlink()


async def watch_foreign_pid(pid: int, ticks: int | None) -> None:
    """Until a process that is not our child exits (pidfd on Linux >= 5.3, else polling).
    `ticks` (its start time) tells it from a later process that got the same pid."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        while start_ticks(pid) == ticks and ticks is not None:  # noqa: ASYNC110 - no event to wait on
            await asyncio.sleep(0.2)
        return
    if ticks is None or start_ticks(pid) != ticks:  # checked after opening: the fd is the same process
        os.close(fd)
        return
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not done.done():
            done.set_result(None)

    loop.add_reader(fd, readable)
    try:
        await done
    finally:
        loop.remove_reader(fd)
        os.close(fd)


class LocalHandle(Handle):
    """One agent process (and its group). Learns the exit code from `waiter`; when that cannot
    tell (None: the warm process went away, or the process was adopted after a restart), from
    the exit file the agent process writes."""

    def __init__(
        self,
        pid: int,
        ticks: int | None,
        files: AttemptFiles,
        deadline: float,
        waiter: Callable[[], Awaitable[int | None]],
        kill_grace: float,
        tail: int,
    ) -> None:
        self.pid = pid
        self.ticks = ticks
        self.files = files
        self.deadline = deadline
        self.kill_grace = kill_grace
        self.tail = tail
        self._waiter = waiter
        self._task = asyncio.create_task(self._watch(), name=f"agent-{pid}")

    async def _watch(self) -> int | None:
        returncode = await self._waiter()
        if returncode is None:
            await watch_foreign_pid(self.pid, self.ticks)
            returncode = self.files.read_exit_code()
        self._signal_group(signal.SIGKILL)  # what the agent left behind in its group goes with it
        return returncode

    def _signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    async def wait(self) -> Outcome:
        returncode = await asyncio.shield(self._task)
        return classify_exit(returncode, tail_lines(self.files.log, self.tail))

    async def kill(self) -> None:
        if self._task.done():
            return
        self._signal_group(signal.SIGTERM)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(self.pid, signal.SIGTERM)  # in case it has not made its own group yet
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._task), self.kill_grace)
        self._signal_group(signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._task), 10.0)


class LocalRunner(Runner):
    def __init__(self, config: ControllerConfig) -> None:
        self.config = config
        local = config.local_runner
        self.capacity = local.maximum_size
        self.log_dir = Path(local.log_dir).absolute()
        self.logs = LogRetention(self.log_dir, local.keep_logs, local.keep_failed_logs)
        self.python = local.python or sys.executable
        self.cwd = local.cwd or None
        self.gateway_url = config.agl_server.url
        self.key = config.agl_server.key
        self.pool = (
            WarmPool(
                self.python,
                self.cwd,
                self.log_dir,
                local.warm_pool_size,
                local.preload_timeout,
                local.preload_retry_seconds,
            )
            if local.warm_start
            else None
        )

    async def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.logs.load()

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()

    def claim_fields(self, rollout: Rollout, attempt_id: str) -> dict[str, Any]:
        return {"log_path": str(AttemptFiles(self.log_dir, rollout.rollout_id, attempt_id).log)}

    async def launch(self, rollout: Rollout, attempt_id: str) -> Handle:
        local = rollout.config.local
        if local is None:
            raise LaunchError(
                "the rollout has no config.local (agent_class or command, env_map); the local runner "
                "needs config.local.agent_class or config.local.command"
            )
        try:
            if local.agent_class is not None:
                parse_agent_class(local.agent_class)
            key = await self.agent_key(rollout.rollout_id, attempt_id)
            env = agent_env(
                rollout, attempt_id, self.gateway_url, key, os.environ, self.config.conventional_env
            )
        except (AgentClassError, EnvMapError) as exc:
            raise LaunchError(str(exc)) from None
        files = AttemptFiles(self.log_dir, rollout.rollout_id, attempt_id)
        try:
            files.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LaunchError(f"cannot create the log directory {files.dir}: {exc}", retryable=True) from exc
        started: tuple[int, Callable[[], Awaitable[int | None]], str] | None
        if local.command is not None:  # any language: no warm process to fork it from
            started = await self._spawn_fresh(["--command", *local.command], env, files)
        else:
            assert local.agent_class is not None  # the schema holds exactly one of the two
            started = await self._spawn_warm(local.agent_class, env, files)
            if started is None:
                started = await self._spawn_fresh([local.agent_class], env, files)
        pid, waiter, mode = started
        deadline = time.time() + rollout.config.timeout_seconds
        ticks = start_ticks(pid)
        try:
            files.write_pid(pid, ticks, deadline)
        except OSError as exc:
            log.warning("pid_file_unwritable", path=str(files.pid), error=str(exc))
        log.debug("agent_started", rollout_id=rollout.rollout_id, attempt_id=attempt_id, pid=pid, mode=mode)
        local_cfg = self.config.local_runner
        return LocalHandle(
            pid, ticks, files, deadline, waiter, local_cfg.kill_grace_seconds, local_cfg.error_tail_lines
        )

    async def _spawn_warm(
        self, agent_class: str, env: dict[str, str], files: AttemptFiles
    ) -> tuple[int, Callable[[], Awaitable[int | None]], str] | None:
        if self.pool is None:
            return None
        server = await self.pool.get(agent_class)
        if server is None:
            return None
        try:
            pid, exit_future = await server.spawn(env, str(files.log), str(files.exit), self.cwd)
        except SpawnFailed as exc:
            if exc.server_lost:
                return None
            raise LaunchError(f"could not start the agent process: {exc}", retryable=True) from exc

        async def waiter() -> int | None:
            return await exit_future

        return pid, waiter, "warm"

    async def _spawn_fresh(
        self, agent: list[str], env: dict[str, str], files: AttemptFiles
    ) -> tuple[int, Callable[[], Awaitable[int | None]], str]:
        """A new process for the agent: bootstrap's arguments, `[module:Class]` or `["--command", *argv]`."""
        try:
            out = os.open(files.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:
            raise LaunchError(f"cannot open the log file {files.log}: {exc}", retryable=True) from exc
        try:
            proc = await asyncio.create_subprocess_exec(
                self.python,
                "-m",
                "agentlightning.controller.bootstrap",
                str(files.exit),
                *agent,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.cwd,
                start_new_session=True,
            )
        except OSError as exc:
            raise LaunchError(f"could not start the agent process: {exc}", retryable=True) from exc
        finally:
            os.close(out)
        return proc.pid, proc.wait, "fresh"

    async def recover(self, rollout: Rollout, attempt_id: str) -> Handle | Outcome | None:
        files = AttemptFiles(self.log_dir, rollout.rollout_id, attempt_id)
        record = files.read_pid()
        code = files.read_exit_code()
        if record is not None and code is None:
            pid = record["pid"]
            ticks = start_ticks(pid)
            if ticks is not None and ticks == record.get("start_ticks"):
                local = self.config.local_runner
                deadline = float(record.get("deadline") or time.time() + rollout.config.timeout_seconds)

                async def unknown() -> int | None:
                    return None

                log.info("agent_adopted", rollout_id=rollout.rollout_id, attempt_id=attempt_id, pid=pid)
                return LocalHandle(
                    pid, ticks, files, deadline, unknown, local.kill_grace_seconds, local.error_tail_lines
                )
            code = files.read_exit_code()  # it may have ended just now
        if code is not None:
            return classify_exit(code, tail_lines(files.log, self.config.local_runner.error_tail_lines))
        if record is None:
            # The pid file is written as soon as the agent is spawned: without it, the controller
            # stopped after claiming the rollout and before starting the agent.
            return Outcome.not_started(
                f"the controller stopped before the agent of attempt {attempt_id} was started"
            )
        return None

    def forget(self, rollout_id: str, attempt_id: str) -> None:
        files = AttemptFiles(self.log_dir, rollout_id, attempt_id)
        failed = files.read_exit_code() != 0  # read before forget() removes it
        files.forget()
        if files.log.exists():
            self.logs.finished(files.log, failed)
