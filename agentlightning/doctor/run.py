"""Run a harness's rollouts through a real Gateway and Controller, and read back what they recorded.

The model server is the user's (an OpenAI-compatible base URL) or the built-in torch engine,
started here. Each path gets its own Gateway (its own SQLite store under the work folder):
`default_proxy.token_exact` on, then off; both with temperature 0, so the probes' greedy answers
are comparable with the recorded ones. Everything started here stops by its pid when the run
ends, however it ends.
"""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from agentlightning.client import GatewayClient
from agentlightning.doctor.analysis import PASS_THROUGH, TOKEN_PATH, RecordedRollout, analyze
from agentlightning.doctor.probes import Probe, ServerProbe, ServerUnreachable, recorded_ids
from agentlightning.doctor.verdict import HarnessReport, judge
from agentlightning.launch import Service, start_controller, start_gateway, start_torch_server
from agentlightning.procs import ProcessFailed

SERVED = "policy"  # the name the built-in engine serves
TERMINAL = ("succeeded", "failed")


class DoctorError(Exception):
    """Bad input or a run that could not be made, said plainly: the command exits 2 with it."""


@dataclass
class AgentSpec:
    """The agent as the Controller's local runner takes it."""

    agent_class: str  # module:Class with a run() method ("" for a command)
    env_map: dict[str, str] = field(default_factory=dict)  # VAR -> input.path
    python: str = ""  # the agent's interpreter ("" = this one)
    cwd: str = ""  # where it runs (its modules are found there)
    env: dict[str, str] = field(default_factory=dict)  # extra environment of the agents
    command: list[str] = field(default_factory=list)  # an agent in any language: its argv

    @property
    def label(self) -> str:
        return self.agent_class or shlex.join(self.command)

    def local_config(self) -> dict[str, Any]:
        """The rollout's `config.local`."""
        agent: dict[str, Any] = (
            {"command": self.command} if self.command else {"agent_class": self.agent_class}
        )
        return {**agent, "env_map": self.env_map}


@dataclass
class DoctorSettings:
    agent: AgentSpec
    tasks: list[dict[str, Any]]
    work: Path
    server: str | None = None  # an OpenAI-compatible base URL; None: start the built-in engine
    model: str = "demo"  # what the built-in engine serves
    served_model: str | None = None  # the name to ask the server for (None: its only model)
    api_key: str = ""
    rollouts: int = 2
    paths: tuple[str, ...] = (TOKEN_PATH, PASS_THROUGH)
    sample_calls: int = 2
    timeout: float = 300.0
    name: str = ""


def load_tasks(path: Path) -> list[dict[str, Any]]:
    """The tasks of a JSONL file, one JSON object a line."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise DoctorError(f"--tasks {path}: {exc.strerror or exc}") from None
    tasks = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            task = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise DoctorError(f"--tasks {path}, line {n}: not JSON ({exc})") from None
        if not isinstance(task, dict):
            raise DoctorError(
                f"--tasks {path}, line {n}: a task must be a JSON object, got {type(task).__name__}"
            )
        tasks.append(task)
    if not tasks:
        raise DoctorError(f"--tasks {path} has no task: one JSON object a line")
    return tasks


def check_agent(agent: AgentSpec) -> None:
    """Load the agent class the way the Controller will, in its interpreter and folder: an agent
    that does not import is said here, not found later in a failed rollout's log."""
    python = agent.python or sys.executable
    if not Path(python).exists():
        raise DoctorError(f"--python {python} does not exist")
    if agent.cwd and not Path(agent.cwd).is_dir():
        raise DoctorError(f"--cwd {agent.cwd} is not a folder")
    if agent.command:
        program = agent.command[0]
        found = (
            os.access(Path(agent.cwd or ".", program), os.X_OK)
            if "/" in program
            else shutil.which(program, path=agent.env.get("PATH", os.environ.get("PATH"))) is not None
        )
        if not found:
            raise DoctorError(
                f"--command: {program!r} is not a program it can run"
                + (f" (in {agent.cwd})" if "/" in program and agent.cwd else " (on PATH)")
            )
        return
    code = "import sys; from agentlightning.controller.bootstrap import load_agent_class as l; l(sys.argv[1])"
    try:
        done = subprocess.run(
            [python, "-c", code, agent.agent_class],
            cwd=agent.cwd or None,
            env={**os.environ, **agent.env},
            capture_output=True,
            text=True,
            timeout=300,
        )
    except subprocess.TimeoutExpired:
        raise DoctorError(f"loading the agent {agent.agent_class} took over 300 s") from None
    if done.returncode != 0:
        last = [line for line in done.stderr.strip().splitlines() if line.strip()]
        raise DoctorError(
            f"the agent {agent.agent_class!r} does not load in {python}"
            + (f" (in {agent.cwd})" if agent.cwd else "")
            + f": {last[-1] if last else 'exit ' + str(done.returncode)}"
        )


def served_name(base_url: str, api_key: str, wanted: str | None) -> str:
    """The model to ask for: `wanted`, which the server must serve, or the server's only model."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(f"{base_url.rstrip('/')}/models", headers=headers, timeout=15.0, trust_env=False)
        response.raise_for_status()
        names = [m.get("id") for m in response.json().get("data", []) if isinstance(m, dict)]
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        raise DoctorError(
            f"the model server at {base_url} does not answer GET /models ({type(exc).__name__}: {exc}); "
            "give the OpenAI base URL of a running server (e.g. http://127.0.0.1:8000/v1)"
        ) from None
    if wanted is not None:
        if wanted not in names:
            raise DoctorError(f"--served-model {wanted}: the server at {base_url} serves {names}")
        return wanted
    if len(names) != 1:
        raise DoctorError(f"the server at {base_url} serves {names}: name one with --served-model")
    return str(names[0])


def _agent_log(folder: Path, rollout_id: str) -> str:
    logs = sorted(folder.glob(f"{rollout_id}*/*.log"))
    lines = [line for p in logs for line in p.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else ""


@contextmanager
def _stack(
    settings: DoctorSettings, upstream: str, model: str, exact: bool, work: Path
) -> Iterator[tuple[GatewayClient, Service]]:
    """A Gateway (token path on or off) and a Controller running the agent: a client, the Controller."""
    work.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(16)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    agent = settings.agent
    with ExitStack() as services:
        gateway = services.enter_context(
            start_gateway(
                "long_poll_max_seconds=2",
                f"default_proxy.model_name={model}",
                f"default_proxy.token_exact={str(exact).lower()}",
                "default_proxy.train.temperature=0",
                "default_proxy.val.temperature=0",
                key=key,
                store_url=f"sqlite:///{work / 'gateway.db'}",
                log_level="warning",
                log_path=work / "gateway.log",
                env=env,
                ready_timeout=180,
            )
        )
        overrides = ["local_runner.preload_timeout=300", "shutdown_timeout=10"]
        if agent.python:
            overrides.append(f"local_runner.python={agent.python}")
        if agent.cwd:
            overrides.append(f"local_runner.cwd={agent.cwd}")
        controller = services.enter_context(
            start_controller(
                gateway.url,
                *overrides,
                runner_type="local",
                key=key,
                log_dir=work / "agents",
                max_agents=max(1, settings.rollouts),
                log_level="warning",
                log_path=work / "controller.log",
                env={**env, **agent.env},
                ready_timeout=180,
            )
        )
        with GatewayClient(gateway.url, key) as client:
            client.register_models([{"model": model, "endpoint": upstream}])
            yield client, controller


def _run_rollouts(
    client: GatewayClient, controller: Service, settings: DoctorSettings, work: Path
) -> list[RecordedRollout]:
    tasks = [settings.tasks[i % len(settings.tasks)] for i in range(settings.rollouts)]
    config = {
        "timeout_seconds": settings.timeout,
        "local": settings.agent.local_config(),
    }
    created = client.create_rollouts([{"input": t, "is_train": True, "config": config} for t in tasks])
    ids = [r.rollout_id for r in created]
    deadline = time.monotonic() + settings.timeout + 120
    while True:
        states = {i: client.get_rollout(i).rollout for i in ids}
        if all(r.status.state.value in TERMINAL for r in states.values()):
            break
        if not controller.alive():
            raise ProcessFailed(f"the Controller exited:\n{controller.log_tail()}")
        if time.monotonic() > deadline:
            left = {i: r.status.state.value for i, r in states.items()}
            raise DoctorError(f"rollouts did not finish within {settings.timeout:.0f} s (+120): {left}")
        time.sleep(0.3)
    out = []
    for rid in ids:
        status = states[rid].status
        error = status.error_message
        if status.state.value != "succeeded":
            last = _agent_log(work / "agents", rid)
            error = f"{error or 'failed'}" + (f" — agent log: {last[:300]}" if last else "")
        out.append(
            RecordedRollout(
                rid,
                status.state.value,
                error,
                client.get_events_json(rid, format="raw"),
                client.get_events_json(rid, format="triplet"),
            )
        )
    return out


def _probes(probe: ServerProbe, rollouts: list[RecordedRollout], sample: int) -> list[Probe]:
    """render + regenerate on up to `sample` calls (later calls first), stream on one chat call."""
    calls = [(r.rollout_id, n, c) for r in rollouts for n, c in enumerate(r.calls) if recorded_ids(c)]
    # Later calls first: they carry the history, where renders and parsers part ways.
    calls.sort(key=lambda t: -t[1])
    out: list[Probe] = []
    for rid, n, call in calls[:sample]:
        out.append(probe.render(rid, n, call))
        out.append(probe.regenerate(rid, n, call))
    chat = [(rid, n, c) for rid, n, c in calls if c.get("api") != "completions"]
    # A call that answered with tool calls where there is one: streamed tool-call parsers differ most.
    chat.sort(key=lambda t: not _answered_tool_calls(t[2]))
    if chat:
        out.append(probe.stream(*chat[0]))
    return out


def run_doctor(settings: DoctorSettings, say: Any = print) -> HarnessReport:
    """Run the harness on each path, probe the server, judge. Raises DoctorError / ProcessFailed."""
    check_agent(settings.agent)
    settings.work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", "TOKENIZERS_PARALLELISM": "false"}
    with ExitStack() as stack:
        if settings.server is None:
            say(f"starting the built-in engine ({settings.model})")
            engine = stack.enter_context(
                start_torch_server(
                    settings.model,
                    served_model_name=SERVED,
                    torch_threads=2,
                    log_level="warning",
                    log_path=settings.work / "engine.log",
                    env=env,
                )
            )
            upstream, server_label = engine.url, f"built-in torch engine ({settings.model})"
        else:
            upstream, server_label = settings.server.rstrip("/"), settings.server
        model = served_name(upstream, settings.api_key, settings.served_model)
        recorded: dict[str, list[RecordedRollout]] = {}
        notes: list[str] = []
        no_token_path = (
            "the model server does not serve vLLM's token endpoints (render / generate / derender): "
            "the Gateway passes calls through, so training sees the server's re-render of each prompt"
        )
        probe = stack.enter_context(closing(ServerProbe(upstream, model, settings.api_key)))
        token_endpoints = probe.serves_token_endpoints()
        for path in settings.paths:
            exact = path == TOKEN_PATH
            if exact and not token_endpoints:  # the token path would pass every call through
                say("  the server serves no token endpoints: the token path is the pass-through")
                notes.append(no_token_path)
                if PASS_THROUGH in settings.paths:
                    continue
                path, exact = PASS_THROUGH, False
            say(f"{settings.name or settings.agent.label}: {settings.rollouts} rollout(s) on the {path}")
            work = settings.work / path.replace(" ", "-")
            with _stack(settings, upstream, model, exact, work) as (client, controller):
                recorded[path] = _run_rollouts(client, controller, settings, work)
            if exact and _passed_through(recorded[path]):
                # The Gateway found the token endpoints missing mid-run (a proxy that forwards
                # only /v1 beside a render that answers): it passed the calls through.
                say("  the server serves no token endpoints: the Gateway passed the calls through")
                recorded[PASS_THROUGH] = recorded.pop(path)
                notes.append(no_token_path)
                break
        reports = [analyze(path, rollouts) for path, rollouts in recorded.items()]
        main = TOKEN_PATH if TOKEN_PATH in recorded else PASS_THROUGH
        try:
            probes = _probes(probe, recorded[main], settings.sample_calls)
        except ServerUnreachable as exc:
            raise DoctorError(f"the model server stopped answering: {exc}") from None
    report = HarnessReport(settings.name or settings.agent.label, server_label, reports, probes, notes=notes)
    return judge(report)


def _answered_tool_calls(call: dict[str, Any]) -> bool:
    choices = (call.get("response") or {}).get("choices") or [{}]
    return bool((choices[0].get("message") or {}).get("tool_calls"))


def _passed_through(rollouts: Sequence[RecordedRollout]) -> bool:
    """Whether the Gateway found the server without the token endpoints: a call of the APIs the
    token path serves was passed through. (A call that goes on from no earlier turn is exact
    either way, served by the chat API: it says nothing of the endpoints.)"""
    calls = [c for r in rollouts for c in r.calls if c.get("api") != "completions"]
    return any((c.get("segment") or {}).get("token_exact") is False for c in calls)
