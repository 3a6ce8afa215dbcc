"""Controller side of the warm fork servers: one per agent class, started on first use."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
import subprocess
import time
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from agentlightning.log import get_logger

log = get_logger("controller.warm")


class SpawnFailed(Exception):
    """The warm process could not fork (`server_lost`: it is gone; use a fresh interpreter)."""

    def __init__(self, message: str, server_lost: bool = False) -> None:
        super().__init__(message)
        self.server_lost = server_lost


class WarmProcess:
    """A running fork server for one agent class."""

    def __init__(self, agent_class: str, python: str, cwd: str | None, log_path: Path) -> None:
        self.agent_class = agent_class
        self.python = python
        self.cwd = cwd
        self.log_path = log_path
        self.proc: asyncio.subprocess.Process | None = None
        self.sources: dict[str, int] = {}  # the agent's source files and their mtime_ns at import
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._next_id = 0
        self._pending: dict[int, asyncio.Future[tuple[int, asyncio.Future[int | None]]]] = {}
        self._exits: dict[int, asyncio.Future[int | None]] = {}
        self.alive = False

    async def start(self, preload_timeout: float) -> None:
        """Start the server and wait for its import. Raises RuntimeError with the reason on failure."""
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            out = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                self.proc = await asyncio.create_subprocess_exec(
                    self.python,
                    "-m",
                    "agentlightning.controller.forkserver",
                    self.agent_class,
                    str(child.fileno()),
                    pass_fds=(child.fileno(),),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=self.cwd,
                    start_new_session=True,
                )
            finally:
                os.close(out)
        except OSError:
            parent.close()
            raise
        finally:
            child.close()
        reader, self._writer = await asyncio.open_unix_connection(sock=parent, limit=1 << 24)
        try:
            line = await asyncio.wait_for(reader.readline(), preload_timeout)
        except TimeoutError:
            await self.stop()
            raise RuntimeError(
                f"importing {self.agent_class!r} took longer than {preload_timeout:.0f}s"
            ) from None
        message = orjson.loads(line) if line else {"op": "error", "message": "the warm process exited"}
        if message.get("op") != "ready":
            await self.stop()
            raise RuntimeError(str(message.get("message", message)))
        self.alive = True
        sources = message.get("sources")
        self.sources = {str(k): int(v) for k, v in sources.items()} if isinstance(sources, dict) else {}
        self._reader_task = asyncio.create_task(self._read(reader), name=f"warm-reader-{self.proc.pid}")

    def changed_sources(self) -> list[str]:
        """The agent's source files changed (or gone) on disk since this process imported them."""
        changed = []
        for path, mtime_ns in self.sources.items():
            try:
                if os.stat(path).st_mtime_ns != mtime_ns:
                    changed.append(path)
            except OSError:
                changed.append(path)
        return changed

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while line := await reader.readline():
                message: dict[str, Any] = orjson.loads(line)
                op = message.get("op")
                if op == "spawned":
                    # The child may exit before spawn() resumes: hand over its exit future now.
                    exit_future = asyncio.get_running_loop().create_future()
                    self._exits[message["pid"]] = exit_future
                    future = self._pending.pop(message["id"], None)
                    if future is not None and not future.done():
                        future.set_result((message["pid"], exit_future))
                elif op == "spawn_failed":
                    future = self._pending.pop(message["id"], None)
                    if future is not None and not future.done():
                        future.set_exception(SpawnFailed(message.get("error", "spawn failed")))
                elif op == "exited":
                    exited = self._exits.pop(message["pid"], None)
                    if exited is not None and not exited.done():
                        exited.set_result(os.waitstatus_to_exitcode(message["status"]))
        except (ConnectionError, ValueError) as exc:
            log.warning("warm_process_stream_error", agent_class=self.agent_class, error=str(exc))
        finally:
            self._lost()

    def _lost(self) -> None:
        """The server is gone: pending spawns fail; exits of its children become unknown (None), and
        their handles watch the processes themselves."""
        if self.alive:
            log.warning("warm_process_lost", agent_class=self.agent_class, log=str(self.log_path))
        self.alive = False
        for future in self._pending.values():
            if not future.done():
                future.set_exception(SpawnFailed("the warm process exited", server_lost=True))
        for exit_future in self._exits.values():
            if not exit_future.done():
                exit_future.set_result(None)
        self._pending.clear()
        self._exits.clear()

    async def spawn(
        self, env: Mapping[str, str], log_path: str, exit_file: str, cwd: str | None
    ) -> tuple[int, asyncio.Future[int | None]]:
        """Fork one child. Returns its pid and a future of its exit code (negative: killed by that
        signal; None: unknown because the server went away)."""
        if not self.alive or self._writer is None:
            raise SpawnFailed("the warm process is not running", server_lost=True)
        self._next_id += 1
        request_id = self._next_id
        future: asyncio.Future[tuple[int, asyncio.Future[int | None]]] = (
            asyncio.get_running_loop().create_future()
        )
        self._pending[request_id] = future
        request = {
            "op": "spawn",
            "id": request_id,
            "env": dict(env),
            "log": log_path,
            "exit_file": exit_file,
            "cwd": cwd,
        }
        try:
            self._writer.write(orjson.dumps(request) + b"\n")
            await self._writer.drain()
        except ConnectionError as exc:
            self._pending.pop(request_id, None)
            self._lost()
            raise SpawnFailed(f"the warm process is gone: {exc}", server_lost=True) from exc
        return await future

    async def stop(self) -> None:
        """Close our end (the server exits on its own) and make sure it does."""
        self.alive = False
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(ConnectionError):
                await self._writer.wait_closed()
        if self.proc is not None and self.proc.returncode is None:
            try:
                await asyncio.wait_for(self.proc.wait(), 2.0)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()  # the server's own pid: its children live in their own sessions
                await self.proc.wait()
        if self._reader_task is not None:
            await asyncio.gather(self._reader_task, return_exceptions=True)


class WarmPool:
    """Warm processes by agent class, least recently used stopped first; remembers failed preloads."""

    def __init__(
        self,
        python: str,
        cwd: str | None,
        log_dir: Path,
        size: int,
        preload_timeout: float,
        retry_seconds: float,
    ) -> None:
        self.python = python
        self.cwd = cwd
        self.log_dir = log_dir
        self.size = size
        self.preload_timeout = preload_timeout
        self.retry_seconds = retry_seconds
        self._servers: OrderedDict[str, asyncio.Task[WarmProcess | None]] = OrderedDict()
        self._failed_until: dict[str, float] = {}
        self._stopping: set[asyncio.Task[None]] = set()

    async def get(self, agent_class: str) -> WarmProcess | None:
        """The warm process for this class, started if needed; None = use a fresh interpreter."""
        if time.monotonic() < self._failed_until.get(agent_class, 0.0):
            return None
        task = self._servers.get(agent_class)
        if task is not None and task.done():
            server = task.result()
            if server is None or not server.alive:
                del self._servers[agent_class]
                task = None
            elif changed := server.changed_sources():
                # Edited since the import: the next rollouts run the code on disk, not the old module.
                log.warning(
                    "agent_source_changed",
                    agent_class=agent_class,
                    files=changed[:5],
                    action="a new warm process imports the agent again",
                )
                self._retire(self._servers.pop(agent_class))
                task = None
        if task is None:
            task = asyncio.create_task(self._start(agent_class), name=f"warm-start-{agent_class}")
            self._servers[agent_class] = task
            await self._evict()
        self._servers.move_to_end(agent_class)
        return await asyncio.shield(task)

    async def _start(self, agent_class: str) -> WarmProcess | None:
        digest = hashlib.sha256(agent_class.encode()).hexdigest()[:12]
        server = WarmProcess(agent_class, self.python, self.cwd, self.log_dir / "_warm" / f"{digest}.log")
        started = time.monotonic()
        try:
            await server.start(self.preload_timeout)
        except asyncio.CancelledError:
            await server.stop()
            raise
        except (OSError, RuntimeError) as exc:
            self._failed_until[agent_class] = time.monotonic() + self.retry_seconds
            log.warning(
                "warm_start_unavailable",
                agent_class=agent_class,
                reason=str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                fallback="fresh interpreter per rollout",
                retry_in_s=self.retry_seconds,
                log=str(server.log_path),
            )
            return None
        log.info(
            "warm_process_ready",
            agent_class=agent_class,
            pid=server.proc.pid if server.proc else None,
            import_s=round(time.monotonic() - started, 3),
        )
        return server

    async def _evict(self) -> None:
        while len(self._servers) > self.size:
            _, task = self._servers.popitem(last=False)
            self._retire(task)

    def _retire(self, task: asyncio.Task[WarmProcess | None]) -> None:
        """Stop a warm process in the background (its running agents live on)."""
        stopper = asyncio.create_task(self._stop_task(task))
        self._stopping.add(stopper)
        stopper.add_done_callback(self._stopping.discard)

    @staticmethod
    async def _stop_task(task: asyncio.Task[WarmProcess | None]) -> None:
        server = await task
        if server is not None:
            await server.stop()

    async def close(self) -> None:
        await asyncio.gather(*self._stopping, return_exceptions=True)
        tasks = list(self._servers.values())
        self._servers.clear()
        for task in tasks:
            if not task.done():
                task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await self._stop_task(task)
