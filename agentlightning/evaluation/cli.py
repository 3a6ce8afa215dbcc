"""`agl-eval`: evaluate one or more policies on a dataset split, through the Gateway, the
Controller and the agent's own harness, as training runs it (no agent change).

    agl-eval data=FILE 'policies=[NAME=SOURCE, ...]' [n=3] [temperature=0] [key=value ...]
                                                        (keys: agentlightning/config/eval.yaml)

For each policy in turn: a Gateway on the eval's SQLite store (`{output_dir}/gateway.db`), a
Controller, and an engine serving the policy (agl-torch-server, or vLLM with engine=vllm; an
endpoint policy is used as it is) start; the missing rollouts — `n` per task — are created as
validation rollouts, run and read back; everything it started stops. Then the report:
`{output_dir}/report.json` (renamed into place when complete), a markdown table on screen and
`{output_dir}/report.png`. The same command on the same `output_dir` resumes a stopped eval:
finished rollouts are found in the store by their ids and not run again (`rollouts.py`).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
from omegaconf import DictConfig, ListConfig, OmegaConf

from agentlightning.client import GatewayClient
from agentlightning.config.loader import catch_interrupts, exit_on_interrupt, fail, load_cli_config
from agentlightning.config.schema import ConfigError
from agentlightning.evaluation import report as reporting
from agentlightning.evaluation import rollouts
from agentlightning.evaluation.policies import (
    Policy,
    PolicyError,
    check_endpoint,
    export_checkpoint,
    parse_policy,
)
from agentlightning.launch import Service, start_controller, start_gateway, start_torch_server
from agentlightning.procs import ProcessFailed
from agentlightning.schemas import LocalRolloutConfig, RolloutConfig
from agentlightning.trainer.config import LocalAgentConfig
from agentlightning.trainer.data import load_samples

PROG = "agl-eval"
SERVED = "policy"  # the name our engines serve and the Gateway routes to
SERVICES_FILE = "services.json"
REPORT_FILE = "report.json"


def say(line: str = "") -> None:
    print(line, flush=True)


class EvalError(Exception):
    """Bad input, said plainly: the command exits 2 with it."""


# --- settings -----------------------------------------------------------------------------


class Settings:
    """The config, checked: every problem is found here, before anything starts."""

    def __init__(self, cfg: DictConfig) -> None:
        self.cfg = cfg
        if not cfg.policies:
            raise EvalError("policies=[...] is empty: name at least one policy (NAME=SOURCE)")
        try:
            self.policies = [parse_policy(str(p)) for p in cfg.policies]
        except PolicyError as exc:
            raise EvalError(str(exc)) from None
        names = [p.name for p in self.policies]
        if len(set(names)) != len(names):
            raise EvalError(f"policies: two policies share a name ({names}); name them NAME=SOURCE")
        self.n = _int(cfg.n, "n", 1)
        self.ks = [_int(k, "k", 1) for k in cfg.k] or list(range(1, self.n + 1))
        too_big = [k for k in self.ks if k > self.n]
        if too_big:
            raise EvalError(
                f"k={too_big[0]} needs at least {too_big[0]} samples per task, but n={self.n}: raise n"
            )
        self.ks = sorted(set(self.ks))
        self.temperature = float(cfg.temperature)
        if self.temperature < 0:
            raise EvalError(f"temperature must be >= 0, got {self.temperature}")
        if cfg.engine not in ("torch", "vllm"):
            raise EvalError(f"engine must be torch or vllm, got {cfg.engine!r}")
        if not cfg.data:
            raise EvalError("data=FILE is not set: the tasks to evaluate on (.jsonl, .json or .parquet)")
        try:
            self.tasks = load_samples(str(cfg.data), key="data")
        except ConfigError as exc:
            raise EvalError(str(exc)) from None
        key = str(cfg.task_id_key)
        self.task_ids = [str(t.get(key, i)) for i, t in enumerate(self.tasks)]
        if len(set(self.task_ids)) != len(self.task_ids):
            raise EvalError(
                f"data: two tasks share the id in {key!r}; give each task its own, or task_id_key=''"
            )
        try:
            command = cfg.agent.get("command")
            command = OmegaConf.to_container(command) if isinstance(command, ListConfig) else command
            self.command = LocalAgentConfig(command=command).argv("agent.command")
        except ConfigError as exc:
            raise EvalError(str(exc)) from None
        if self.command is not None and (cfg.agent.agent_class or cfg.agent.python):
            raise EvalError(
                "agent.command is an agent in any language; with it set agent.agent_class=null (its "
                "default is the demo's agent) and leave agent.python unset (a class agent's interpreter)"
            )
        if self.command is None and not cfg.agent.agent_class:
            raise EvalError(
                "agent.agent_class is not set: the agent the Controller runs (or agent.command for "
                "an agent in any language)"
            )
        if cfg.agent.python and not os.access(str(cfg.agent.python), os.X_OK):
            raise EvalError(
                f"agent.python: {cfg.agent.python} is not an executable (the agents' interpreter)"
            )
        if cfg.agent.cwd and not Path(str(cfg.agent.cwd)).is_dir():
            raise EvalError(f"agent.cwd: {cfg.agent.cwd} is not a folder (where the agents start)")
        self.output_dir = Path(str(cfg.output_dir)).resolve()
        self.data_hash = hashlib.sha256(orjson.dumps(self.tasks, option=orjson.OPT_SORT_KEYS)).hexdigest()

    def rollout_settings(self, policy: Policy) -> dict[str, Any]:
        """What a rollout's outcome depends on besides its task and sample: its id's hash."""
        return {
            "data": self.data_hash,
            "agent": OmegaConf.to_container(self.cfg.agent),
            "temperature": self.temperature,
            "engine": str(self.cfg.engine) if policy.kind != "endpoint" else "endpoint",
            "seed": int(self.cfg.seed),
        }


def runner_overrides(agent: DictConfig) -> list[str]:
    """The Controller's settings for the agents' interpreter and folder (`agent.python`, `agent.cwd`)."""
    keys = {"local_runner.python": agent.python, "local_runner.cwd": agent.cwd}
    # absolute, not resolved: a venv's python is a link to the base interpreter, and its venv is
    # found from the path it was started by
    return [f"{key}={Path(str(value)).absolute()}" for key, value in keys.items() if value]


def _int(value: Any, key: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise EvalError(f"{key} must be an integer >= {minimum}, got {value!r}")
    return value


# --- services left by a crash ---------------------------------------------------------------


def _start_time(pid: int) -> str | None:
    """The kernel's start time of `pid` (field 22 of /proc/PID/stat), None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


class ServiceLedger:
    """`services.json`: the pids (and start times) of this eval and what it started, so that a
    restart after a SIGKILL stops what the killed eval left running — by pid, only where the
    start time still matches — and a second eval on the same folder is refused."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / SERVICES_FILE
        self.entries: list[dict[str, Any]] = []

    def claim(self) -> None:
        if self.path.is_file():
            old = orjson.loads(self.path.read_bytes())
            owner = old.get("eval", {})
            mine = owner.get("pid") == os.getpid()  # an earlier eval in this process (main() called twice)
            if not mine and owner.get("pid") and _start_time(owner["pid"]) == owner.get("start"):
                raise EvalError(f"another agl-eval (pid {owner['pid']}) is running on {self.path.parent}")
            stopped = []
            for entry in old.get("services", []):
                if _start_time(entry["pid"]) == entry["start"]:
                    try:
                        os.killpg(entry["pid"], signal.SIGKILL)
                        stopped.append(f"{entry['name']} (pid {entry['pid']})")
                    except ProcessLookupError:
                        pass
            if stopped:
                say(f"Stopped what a stopped agl-eval left running: {', '.join(stopped)}")
        self.entries = []
        self._write()

    def add(self, name: str, pid: int) -> None:
        self.entries.append({"name": name, "pid": pid, "start": _start_time(pid)})
        self._write()

    def _write(self) -> None:
        me = {"pid": os.getpid(), "start": _start_time(os.getpid())}
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_bytes(orjson.dumps({"eval": me, "services": self.entries}))
        os.replace(tmp, self.path)

    def release(self) -> None:
        self.path.unlink(missing_ok=True)


# --- the run ------------------------------------------------------------------------------


class Evaluation:
    def __init__(self, settings: Settings) -> None:
        self.s = settings
        self.cfg = settings.cfg
        self.dir = settings.output_dir
        self.key = secrets.token_urlsafe(16)
        self.services: list[Service] = []
        self.env = dict(os.environ)
        threads = str(int(self.cfg.torch_threads))
        self.env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, TOKENIZERS_PARALLELISM="false")
        self.ledger = ServiceLedger(self.dir)
        self.vllm: Any = None  # VLLMServers serving the policy under evaluation (engine=vllm)
        self.engine: Service | None = None  # the agl-torch-server serving it (engine=torch)
        self.gateway: Service | None = None
        self.gateway_model = ""  # the served name the running Gateway routes to
        self.controller: Service | None = None

    def _track(self, service: Service) -> Service:
        self.services.append(service)
        self.ledger.add(service.name, service.pid)
        return service

    def stop_engine(self) -> None:
        if self.vllm is not None:
            self.vllm.stop()
            self.vllm = None
        if self.engine is not None:
            self.engine.stop(timeout=20)
            self.services.remove(self.engine)
            self.engine = None

    def stop_all(self) -> None:
        self.stop_engine()
        for service in reversed(self.services):
            service.stop(timeout=20)
        self.services = []
        self.gateway = self.controller = None

    def check_alive(self) -> None:
        for service in self.services:
            if not service.alive():
                raise ProcessFailed(f"the {service.name} exited during the eval:\n{service.log_tail()}")
        if self.vllm is not None and not all(s.alive() for s in self.vllm.servers):
            raise ProcessFailed("a vLLM server exited during the eval (logs under the eval's vllm/ folder)")

    def served_model(self, policy: Policy) -> str:
        """The name the policy's engine serves: ours `policy`, an endpoint's its one model."""
        if policy.kind != "endpoint":
            return SERVED
        import httpx

        try:
            models = (
                httpx.get(f"{policy.source}/models", timeout=10.0, trust_env=False).json().get("data", [])
            )
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            raise EvalError(f"policy {policy.name}: GET {policy.source}/models failed: {exc}") from None
        names = [m.get("id") for m in models if isinstance(m, dict)]
        if len(names) != 1:
            raise EvalError(
                f"policy {policy.name}: the endpoint serves {names}; an endpoint policy needs exactly one model"
            )
        return str(names[0])

    def start_engine(self, policy: Policy) -> str:
        """Serve the policy; its OpenAI base URL."""
        if policy.kind == "endpoint":
            return policy.source
        model = policy.source
        if policy.kind == "checkpoint":
            # Named by the source too: the same name given to another checkpoint is another folder.
            target = (
                self.dir
                / "models"
                / f"{policy.name}-{hashlib.sha256(policy.source.encode()).hexdigest()[:8]}"
            )
            if not target.exists():
                say(f"  {policy.name}: writing the checkpoint out as a model folder, {target}")
            model = str(export_checkpoint(policy.source, target))
        log = self.dir / "logs" / f"engine-{policy.name}.log"
        if self.cfg.engine == "vllm":
            from agentlightning.torch_backend.vllm_server import VLLMServerConfig, VLLMServers

            self.vllm = VLLMServers(
                model, SERVED, VLLMServerConfig(seed=int(self.cfg.seed)), self.dir / "vllm" / policy.name
            )
            self.vllm.start()
            for pid in self.vllm.pids:
                self.ledger.add(f"vLLM ({policy.name})", pid)
            return str(self.vllm.endpoints[0])
        self.engine = self._track(
            start_torch_server(
                model,
                served_model_name=SERVED,
                seed=int(self.cfg.seed),
                torch_threads=int(self.cfg.torch_threads),
                log_level=str(self.cfg.log_level),
                log_path=log,
                env=self.env,
                name=f"engine ({policy.name})",
            )
        )
        return self.engine.url

    def wanted(self, policy: Policy) -> dict[str, tuple[int, int]]:
        """{rollout id: (task, sample)} of every rollout the policy's numbers need."""
        key = rollouts.run_key(policy.source, self.s.rollout_settings(policy))
        return {
            rollouts.rollout_id(key, t, j): (t, j) for t in range(len(self.s.tasks)) for j in range(self.s.n)
        }

    def gateway_for(self, served: str) -> Service:
        """The Gateway on the eval's store, routing to `served`: kept from the previous policy
        when it routes to the same name (then the Controller is kept too), else started anew."""
        if self.gateway is not None and self.gateway_model == served:
            return self.gateway
        self.stop_all()
        self.gateway_model = served
        self.gateway = self._track(
            start_gateway(
                f"default_proxy.model_name={served}",
                f"default_proxy.val.temperature={self.s.temperature}",
                key=self.key,
                store_url=f"sqlite:///{self.dir / 'gateway.db'}",
                log_level=str(self.cfg.log_level),
                log_path=self.dir / "logs" / "gateway.log",
                env=self.env,
                name="gateway",
                ready_timeout=180,
            )
        )
        return self.gateway

    def drop_unfinished(self) -> None:
        """Before any Controller runs: delete the rollouts a stopped eval left queued or running
        (their agents died with it; a Controller would otherwise run them on the wrong engine)."""
        gateway = self.gateway_for(self.served_model(self.s.policies[0]))
        with GatewayClient(gateway.url, self.key) as client:
            for policy in self.s.policies:
                dropped = rollouts.drop_unfinished(client, list(self.wanted(policy)))
                if dropped:
                    say(f"  {policy.name}: {dropped} rollouts a stopped eval left unfinished will run again")

    def run_policy(self, policy: Policy) -> list[rollouts.RolloutResult]:
        wanted = self.wanted(policy)
        gateway = self.gateway_for(self.served_model(policy))
        with GatewayClient(gateway.url, self.key) as client:
            done = rollouts.states(client, list(wanted))
            missing = {rid: ts for rid, ts in wanted.items() if rid not in done}
            if missing:
                try:
                    self._run_missing(client, policy, gateway.url, missing, len(wanted))
                finally:
                    self.stop_engine()
            else:
                say(f"  {policy.name}: all {len(wanted)} rollouts found finished in the store")
            return rollouts.read(client, wanted)

    def _run_missing(
        self, client: GatewayClient, policy: Policy, url: str, missing: dict[str, tuple[int, int]], total: int
    ) -> None:
        if self.controller is None:
            self.controller = self._track(
                start_controller(
                    url,
                    *runner_overrides(self.cfg.agent),
                    runner_type="local",
                    key=self.key,
                    max_agents=int(self.cfg.agents_at_once),
                    log_dir=self.dir / "agents",
                    log_level=str(self.cfg.log_level),
                    log_path=self.dir / "logs" / "controller.log",
                    env=self.env,
                    name="controller",
                    ready_timeout=180,
                )
            )
        endpoint = self.start_engine(policy)
        client.delete_models()
        client.register_models([{"model": self.served_model(policy), "endpoint": endpoint}])
        config = RolloutConfig(
            timeout_seconds=float(self.cfg.rollout_timeout_seconds),
            local=LocalRolloutConfig(
                agent_class=str(self.cfg.agent.agent_class) if self.s.command is None else None,
                command=self.s.command,
                env_map={str(k): str(v) for k, v in self.cfg.agent.env_map.items()},
            ),
        )
        progress = rollouts.Progress(policy.name, total, total - len(missing))
        progress(0)
        rollouts.create(client, missing, self.s.tasks, config, policy.name)
        rollouts.wait(client, set(missing), progress, self.check_alive)

    def run(self) -> dict[str, Any]:
        started = time.perf_counter()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ledger.claim()
        (self.dir / REPORT_FILE).unlink(missing_ok=True)  # a new run's report replaces it when complete
        summaries: dict[str, dict[str, Any]] = {}
        seed, boot = int(self.cfg.seed), int(self.cfg.bootstrap_samples)
        self.drop_unfinished()
        for policy in self.s.policies:
            say(f"{policy.describe()}: {len(self.s.tasks)} tasks × {self.s.n} samples")
            results = self.run_policy(policy)
            summaries[policy.name] = {
                "source": policy.source,
                "kind": policy.kind,
                **reporting.summarize_policy(
                    results,
                    self.s.task_ids,
                    self.s.n,
                    self.s.ks,
                    float(self.cfg.success_threshold),
                    seed,
                    boot,
                ),
            }
        self.stop_all()
        names = list(summaries)
        comparisons = [
            reporting.compare(names[0], other, summaries, self.s.ks, seed, boot) for other in names[1:]
        ]
        self.ledger.release()
        return {
            "settings": {
                "data": str(Path(str(self.cfg.data)).resolve()),
                "tasks": len(self.s.tasks),
                "n": self.s.n,
                "k": self.s.ks,
                "temperature": self.s.temperature,
                "success_threshold": float(self.cfg.success_threshold),
                "engine": str(self.cfg.engine),
                "agent": OmegaConf.to_container(self.cfg.agent),
                "seed": seed,
                "bootstrap_samples": boot,
                "intervals": {
                    "success_rate": "Wilson score, 95 %, over all rollouts",
                    "mean_reward, pass_at_k": "percentile bootstrap over tasks, 95 %",
                    "differences": "paired percentile bootstrap over tasks, 95 %",
                    "flips": f"a task is solved when at least {reporting.SOLVED:.0%} of its samples succeed",
                },
            },
            "policies": summaries,
            "comparisons": comparisons,
            "wall_seconds": time.perf_counter() - started,
        }


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    cfg = load_cli_config("eval", args, prog=PROG, free_maps=["agent.env_map"])
    try:
        settings = Settings(cfg)
        for policy in settings.policies:
            if policy.kind == "endpoint":
                check_endpoint(policy)
    except (EvalError, PolicyError) as exc:
        fail(PROG, str(exc))
    evaluation = Evaluation(settings)
    catch_interrupts()
    with exit_on_interrupt(
        PROG, "interrupted; every process it started is stopped", cleanup=evaluation.stop_all
    ):
        try:
            result = evaluation.run()
        except (EvalError, PolicyError) as exc:
            evaluation.stop_all()
            fail(PROG, str(exc))
        except ProcessFailed as exc:
            evaluation.stop_all()
            fail(PROG, f"{exc}\n(logs: {evaluation.dir / 'logs'})", 1)
        finally:
            evaluation.stop_all()
    out = evaluation.dir
    if cfg.plot:
        reporting.plot(result, out / "report.png")
    reporting.write_json(out / REPORT_FILE, result)
    say("")
    say(reporting.markdown(result))
    say(f"\nReport: {out / REPORT_FILE}" + (f"\nPlot:   {out / 'report.png'}" if cfg.plot else ""))
    say(f"Wall time: {result['wall_seconds']:.0f} s")


if __name__ == "__main__":
    main()
