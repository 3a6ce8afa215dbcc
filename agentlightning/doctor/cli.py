"""`agl-doctor`: is this harness trainable? Runs a handful of its rollouts through the Gateway, on
the token path and on pass-through, asks the model server a few sampled checks, and says so.

    agl-doctor (--agent MODULE:CLASS | --command 'CMD ARGS') --tasks TASKS.jsonl [--env-map VAR=input.key ...]
               [--cwd DIR] [--python PY] [--server URL | --model demo] [--rollouts 2] [--json]

Exit status: 0 trainable; 1 trainable with breaks (a rollout makes more than one training row);
3 not trainable; 2 bad input or a run that could not be made (an agent that does not load, a
server that does not answer); 130 interrupted. See docs/doctor.md.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import orjson

from agentlightning.config.loader import catch_interrupts, exit_on_interrupt, fail
from agentlightning.doctor.analysis import PASS_THROUGH, TOKEN_PATH
from agentlightning.doctor.run import AgentSpec, DoctorError, DoctorSettings, load_tasks, run_doctor
from agentlightning.doctor.verdict import EXIT_BAD_INPUT, markdown
from agentlightning.procs import ProcessFailed

PROG = "agl-doctor"
PATHS = {"both": (TOKEN_PATH, PASS_THROUGH), "token": (TOKEN_PATH,), "pass-through": (PASS_THROUGH,)}


def _pairs(values: list[str], flag: str) -> dict[str, str]:
    out = {}
    for value in values:
        name, sep, target = value.partition("=")
        if not sep or not name.strip():
            raise DoctorError(f"{flag} {value!r}: expected NAME=VALUE")
        out[name.strip()] = target
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    agent = p.add_argument_group("the agent (as the Controller's local runner takes it)")
    which = agent.add_mutually_exclusive_group(required=True)
    which.add_argument("--agent", help="its class: module:Class with a run() method")
    which.add_argument(
        "--command",
        help="or an agent in any language: its command line (e.g. 'node agent.js'), run in --cwd",
    )
    agent.add_argument("--tasks", required=True, type=Path, help="a JSONL file of rollout inputs, one a line")
    agent.add_argument(
        "--env-map",
        action="append",
        default=[],
        metavar="VAR=input.KEY",
        help="an environment variable from the input",
    )
    agent.add_argument("--cwd", default="", help="the folder it runs in (where its module is)")
    agent.add_argument("--python", default="", help="its interpreter (default: this one)")
    agent.add_argument(
        "--env", action="append", default=[], metavar="VAR=VALUE", help="extra environment for it"
    )
    server = p.add_argument_group("the model server")
    server.add_argument(
        "--server", default=None, help="an OpenAI-compatible base URL (vLLM: http://HOST:PORT/v1)"
    )
    server.add_argument(
        "--model", default="demo", help="what the built-in engine serves when --server is not given"
    )
    server.add_argument(
        "--served-model", default=None, help="the model name on --server (default: its only one)"
    )
    server.add_argument("--api-key", default="", help="the key --server wants")
    run = p.add_argument_group("the run")
    run.add_argument("--rollouts", type=int, default=2, help="rollouts per path (default 2)")
    run.add_argument("--paths", choices=sorted(PATHS), default="both", help="which Gateway paths to run")
    run.add_argument(
        "--sample-calls", type=int, default=2, help="recorded calls to re-render and re-generate"
    )
    run.add_argument("--timeout", type=float, default=300.0, help="seconds a rollout may take")
    run.add_argument(
        "--work", type=Path, default=None, help="keep the logs and stores here (default: a temporary folder)"
    )
    run.add_argument("--name", default="", help="the harness's name in the report")
    run.add_argument("--json", action="store_true", help="print the report as JSON instead of Markdown")
    return p


def settings_from(args: argparse.Namespace, work: Path) -> DoctorSettings:
    if args.rollouts < 1:
        raise DoctorError(f"--rollouts must be at least 1, got {args.rollouts}")
    if args.sample_calls < 0:
        raise DoctorError(f"--sample-calls must be >= 0, got {args.sample_calls}")
    if args.timeout <= 0:
        raise DoctorError(f"--timeout must be positive, got {args.timeout}")
    if args.server is not None and args.model != "demo":
        raise DoctorError(
            "--model names what the built-in engine serves; with --server it does nothing: drop one"
        )
    if args.command is not None and args.python:
        raise DoctorError("--python is the interpreter of an --agent class; a --command names its own")
    try:
        command = shlex.split(args.command) if args.command is not None else []
    except ValueError as exc:
        raise DoctorError(f"--command: {exc} in {args.command!r}") from None
    if args.command is not None and not command:
        raise DoctorError("--command is empty: give the agent's command line")
    agent = AgentSpec(
        args.agent or "",
        _pairs(args.env_map, "--env-map"),
        str(Path(args.python).absolute()) if args.python else "",
        str(Path(args.cwd).resolve()) if args.cwd else "",
        _pairs(args.env, "--env"),
        command,
    )
    return DoctorSettings(
        agent,
        load_tasks(args.tasks),
        work,
        server=args.server,
        model=args.model,
        served_model=args.served_model,
        api_key=args.api_key,
        rollouts=args.rollouts,
        paths=PATHS[args.paths],
        sample_calls=args.sample_calls,
        timeout=args.timeout,
        name=args.name,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    catch_interrupts()
    with tempfile.TemporaryDirectory(prefix="agl-doctor-") as tmp:
        work = args.work.resolve() if args.work is not None else Path(tmp)
        with exit_on_interrupt(PROG, "interrupted; every process it started is stopped"):
            try:
                settings = settings_from(args, work)
                # Progress to stderr: stdout is the report (JSON with --json).
                report = run_doctor(settings, say=lambda line: print(line, file=sys.stderr, flush=True))
            except DoctorError as exc:
                fail(PROG, str(exc), EXIT_BAD_INPUT)
            except ProcessFailed as exc:
                keep = (
                    f"(logs: {work})" if args.work is not None else "(rerun with --work DIR to keep the logs)"
                )
                fail(PROG, f"{exc}\n{keep}", EXIT_BAD_INPUT)
    if args.json:
        print(orjson.dumps(report.to_json(), option=orjson.OPT_INDENT_2).decode())
    else:
        print(markdown(report))
    return report.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
