"""The warm process: imports an agent's module once, then forks one child per rollout.

Run by the local runner as `python -m agentlightning.controller.forkserver module:Class FD`,
where FD is its end of a socket pair. Messages are JSON lines:

  server -> controller: {"op": "ready", "pid", "sources"} | {"op": "error", "message"}   (once, after
                        the import; `sources`: {path: mtime_ns} of the agent's own source files)
  controller -> server: {"op": "spawn", "id", "env", "log", "exit_file", "cwd"}
  server -> controller: {"op": "spawned", "id", "pid"} | {"op": "spawn_failed", "id", "error"}
                        {"op": "exited", "pid", "status"}   (raw wait status, for each child)

Each child starts its own session (process group), gets its rollout's environment, the log file
as stdout and stderr, and then runs the agent exactly as a fresh interpreter would, ending
through the interpreter's normal exit. The server exits when the controller's end closes; its
children keep running (a restarted controller adopts them).

`sources` are the Python files the agent's import loaded from outside the interpreter's own
library folders (the agent's module and its helpers): the controller compares their modification
times before each rollout and replaces a warm process whose agent changed on disk.

The server stays single-threaded: forking a process with threads is unsafe, so a module that
starts threads at import is refused and the controller uses fresh interpreters for it.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import sys
import sysconfig
import threading
import traceback
from typing import Any

import orjson

from agentlightning.controller import bootstrap


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall(orjson.dumps(message) + b"\n")


def _thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:  # not Linux: only Python's own threads are visible
        return threading.active_count()


MAX_SOURCES = 256  # files watched per agent class (each is one stat per rollout)


def _sources(before: set[str]) -> dict[str, int]:
    """{path: mtime_ns} of the .py files of the modules imported since `before`, except the
    interpreter's own and installed packages' (site-packages)."""
    paths = sysconfig.get_paths()
    libraries = tuple(
        os.path.join(os.path.realpath(paths[k]), "") for k in ("stdlib", "platstdlib", "purelib", "platlib")
    )
    out: dict[str, int] = {}
    for name in sorted(set(sys.modules) - before):
        path = getattr(sys.modules.get(name), "__file__", None)
        if not isinstance(path, str) or not path.endswith(".py"):
            continue
        path = os.path.realpath(path)
        if path.startswith(libraries) or "site-packages" in path or "dist-packages" in path:
            continue
        try:
            out[path] = os.stat(path).st_mtime_ns
        except OSError:
            continue
        if len(out) >= MAX_SOURCES:
            break
    return out


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(sock, {"op": "exited", "pid": pid, "status": status})


class _Child:
    """Returned from serve() in a forked child only: what the child must run."""

    def __init__(self, exit_file: str) -> None:
        self.exit_file = exit_file


def _become_child(
    sock: socket.socket, wake_r: int, wake_w: int, log_fd: int, request: dict[str, Any]
) -> _Child:
    # Signal dispositions of a fresh interpreter.
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    sock.close()
    os.close(wake_r)
    os.close(wake_w)
    os.setsid()
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.environ.clear()
    os.environ.update(request["env"])
    if request.get("cwd"):
        os.chdir(request["cwd"])
    bootstrap.reseed_random_state()
    return _Child(request.get("exit_file") or "")


def serve(sock: socket.socket) -> _Child | None:
    """Answer spawn requests until the controller goes away (returns None). Returns a _Child in
    each forked child."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a Python handler makes the wakeup fd fire
    buffer = b""
    while True:
        readable, _, _ = select.select([sock.fileno(), wake_r], [], [])
        if wake_r in readable:
            try:
                while os.read(wake_r, 512):
                    pass
            except BlockingIOError:
                pass
            _reap(sock)
        if sock.fileno() not in readable:
            continue
        data = sock.recv(1 << 20)
        if not data:
            return None
        buffer += data
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            request = orjson.loads(line)
            if request.get("op") != "spawn":
                continue
            try:
                log_fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            except OSError as exc:
                _send(sock, {"op": "spawn_failed", "id": request["id"], "error": f"cannot open log: {exc}"})
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            try:
                pid = os.fork()
            except OSError as exc:
                os.close(log_fd)
                _send(sock, {"op": "spawn_failed", "id": request["id"], "error": f"fork failed: {exc}"})
                continue
            if pid == 0:
                return _become_child(sock, wake_r, wake_w, log_fd, request)
            os.close(log_fd)
            _send(sock, {"op": "spawned", "id": request["id"], "pid": pid})
        _reap(sock)  # a child may have exited before its SIGCHLD handler ran


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    spec, fd = args[0], int(args[1])
    sock = socket.socket(fileno=fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the controller, which stops us
    before = set(sys.modules)
    try:
        cls = bootstrap.load_agent_class(spec)
        threads = _thread_count()
        if threads > 1:
            raise bootstrap.AgentClassError(
                f"importing {spec!r} started {threads - 1} thread(s); forking a threaded process is unsafe"
            )
    except Exception as exc:
        detail = "".join(traceback.format_exception(exc.__cause__)) if exc.__cause__ else ""
        _send(sock, {"op": "error", "message": f"{exc}\n{detail}".strip()})
        raise SystemExit(1) from None
    _send(sock, {"op": "ready", "pid": os.getpid(), "sources": _sources(before)})
    child = serve(sock)
    if child is None:
        return  # the controller closed its end: our children live on in their own sessions
    sys.argv = [spec]
    bootstrap.run_and_exit(cls, child.exit_file)


if __name__ == "__main__":
    main()
