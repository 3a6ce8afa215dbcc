"""Inside an agent's process: load the agent class, run it, record how it ended.

Used in two ways with the same result: as the program of a fresh interpreter
(`python -m agentlightning.controller.bootstrap EXIT_FILE module:Class`) and by the warm
fork server in each forked child. An agent given as a command, in any language
(`python -m agentlightning.controller.bootstrap EXIT_FILE --command ARGV...`), runs as this
process's child, in its process group (the runner's stop reaches it), and its exit code is
recorded the same way. Keep this module's imports light: a fresh start pays for them.
"""

from __future__ import annotations

import asyncio
import atexit
import importlib
import inspect
import os
import re
import sys
import threading
import traceback
from typing import Any, NoReturn

# module.Class or module:Class; after ':' a dotted path inside the module is allowed (Outer.Inner).
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_AGENT_CLASS = re.compile(rf"^(?P<module>{_IDENT}(?:\.{_IDENT})*)(?::(?P<attr>{_IDENT}(?:\.{_IDENT})*))?$")

EXIT_LOAD_FAILED = 2  # the agent class could not be loaded (same code as a usage error)


class AgentClassError(ValueError):
    """agent_class is malformed or cannot be loaded; the message says which and why."""


def parse_agent_class(spec: str) -> tuple[str, str]:
    """Split `module.Class` or `module:Class` into (module, attribute path)."""
    match = _AGENT_CLASS.match(spec.strip()) if isinstance(spec, str) else None
    if match is None:
        raise AgentClassError(
            f"agent_class {spec!r} must look like 'package.module.Class' or 'package.module:Class'"
        )
    module, attr = match["module"], match["attr"]
    if attr is None:
        if "." not in module:
            raise AgentClassError(
                f"agent_class {spec!r} names no class: use 'module.Class' or 'module:Class'"
            )
        module, _, attr = module.rpartition(".")
    return module, attr


def load_agent_class(spec: str) -> type:
    """Import the module and return the class. Raises AgentClassError with the cause."""
    module_name, attr = parse_agent_class(spec)
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:
        raise AgentClassError(
            f"cannot import module {module_name!r} of agent_class {spec!r}: {type(exc).__name__}: {exc}"
        ) from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise AgentClassError(f"agent_class {spec!r}: module {module_name!r} has no {attr!r}") from None
    if not callable(getattr(obj, "run", None)):
        raise AgentClassError(f"agent_class {spec!r} has no run() method")
    return obj


async def _await(awaitable: Any) -> Any:
    return await awaitable


def run_agent(cls: type) -> int:
    """Instantiate the agent and call run(), sync or async. Returns the process exit code."""
    try:
        result = cls().run()
        if inspect.iscoroutine(result):
            asyncio.run(result)
        elif inspect.isawaitable(result):
            asyncio.run(_await(result))
        return 0
    except SystemExit as exc:
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code & 0xFF
        print(exc.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        traceback.print_exc()
        return 130
    except BaseException:
        traceback.print_exc()
        return 1


def write_exit_file(path: str, code: int) -> None:
    """Record the exit code where a restarted controller can find it (atomic: write, then rename)."""
    if not path:
        return
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            f.write(f'{{"exit_code": {code}}}\n')
        os.replace(tmp, path)
    except OSError as exc:
        print(f"agl-agent: could not write {path}: {exc}", file=sys.stderr)


def reseed_random_state() -> None:
    """A forked child inherits its parent's random state; draw fresh seeds as a new process would."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        try:
            numpy.random.seed()
        except Exception:  # a broken or partial numpy must not stop the agent
            pass


def run_and_exit(cls: type, exit_file: str) -> NoReturn:
    """Run the agent and end the process like a forked multiprocessing child does: join the
    agent's non-daemon threads, run its atexit handlers, flush stdout and stderr, record the exit
    code, then leave without tearing down every module. That teardown touches every object of
    the heap (for a process that imported `openai`, about 0.1 s of CPU per rollout, and in a
    forked child it copies the whole shared heap); nothing an agent relies on happens in it."""
    code = run_agent(cls)
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # what the interpreter does first at exit
    except Exception:
        traceback.print_exc()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    write_exit_file(exit_file, code)
    os._exit(code)


EXIT_NOT_FOUND = 127  # the command could not be started (as a shell says)


def run_command(argv: list[str], exit_file: str) -> NoReturn:
    """Run an agent given as a command and end as it ended: with its exit code (recorded), or by
    the signal that killed it (not recorded, as a killed class agent records nothing)."""
    import signal
    import subprocess

    try:
        child = subprocess.Popen(argv)
    except OSError as exc:
        print(f"agl-agent: cannot run the agent command {argv[0]!r}: {exc.strerror or exc}", file=sys.stderr)
        write_exit_file(exit_file, EXIT_NOT_FOUND)
        raise SystemExit(EXIT_NOT_FOUND) from None
    # The runner stops the whole process group; a SIGTERM sent to this process alone is passed on.
    signal.signal(signal.SIGTERM, lambda signum, frame: child.send_signal(signum))
    code = child.wait()
    if code < 0:
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # the two no handler can be set for
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    write_exit_file(exit_file, code)
    os._exit(code)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) >= 3 and args[1] == "--command":
        run_command(args[2:], args[0])
    if len(args) != 2:
        print(
            "usage: python -m agentlightning.controller.bootstrap EXIT_FILE module:Class\n"
            "       python -m agentlightning.controller.bootstrap EXIT_FILE --command ARGV...",
            file=sys.stderr,
        )
        raise SystemExit(EXIT_LOAD_FAILED)
    exit_file, spec = args
    sys.argv = [spec]
    try:
        cls = load_agent_class(spec)
    except AgentClassError as exc:
        if exc.__cause__ is not None:
            traceback.print_exception(exc.__cause__)
        print(f"agl-agent: {exc}", file=sys.stderr)
        write_exit_file(exit_file, EXIT_LOAD_FAILED)
        raise SystemExit(EXIT_LOAD_FAILED) from None
    run_and_exit(cls, exit_file)


if __name__ == "__main__":
    main()
