"""Restart benchmark: rollouts and training survive a Gateway, a Controller and a trainer killed
with SIGKILL mid-batch and mid-step.

Services phase (`--phase services`). A Gateway (SQLite store) and a Controller (local runner)
serve a batch of rollouts whose agents use the official `openai` client
(bench/restarts_agent.py: it retries, and so does its reward post); the fake vLLM-shaped model
server answers. While the batch runs, the Gateway is SIGKILLed and restarted on the same file
and port `--gateway-kills` times, and the Controller is SIGKILLed and restarted once (it adopts
its running agents again from their pid files). This script plays the trainer: it created the
rollouts and waits for them. It reports rollouts succeeded / failed / lost (created and
acknowledged, but not terminal by the deadline or gone from the store), and the failures'
messages.

Trainer phase (`--phase trainer`). The real trainer (`agl-train`, torch backend, the demo's
tiny model and task, the demo's agent on the `openai` client, a checkpoint every step) runs
as its own process against a Gateway and a Controller: first a reference run, uninterrupted;
then the same config in a fresh folder, where trainer #1 is SIGKILLed while the rollouts of
step `--kill-in-rollouts` run (seen in the Gateway's rollout list), trainer #2 resumes on the
same checkpoint folder and SIGKILLs itself in the policy update of step `--kill-in-update`
(bench/restarts_trainer.py), trainer #3 resumes and SIGKILLs itself while saving the checkpoint
of step `--kill-in-save` (after the weights, before the loop state), and trainer #4 resumes and
finishes. It reports each resume's
step against the newest complete checkpoint, each step's data (the prompts of its rollouts, read
from the Gateway: the trainers keep their rollouts) beside the reference run's, the final step,
model version and data position, what became of the rollouts the killed trainers had made, and
rollouts succeeded / failed / lost.

Usage: python bench/restarts.py [--phase all|services|trainer] [--rollouts 300] [--concurrency 16]
           [--gateway-kills 2] [--train-steps 6] [--train-batch 4] [--train-group 4]
           [--kill-in-rollouts 2] [--kill-in-update 4] [--kill-in-save 5]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from omegaconf import OmegaConf

from agentlightning.client import GatewayClient
from agentlightning.demo.task import make_dataset
from agentlightning.launch import start_controller, start_gateway
from agentlightning.procs import ManagedProcess, free_port
from agentlightning.schemas import Model, Rollout, RolloutState
from agentlightning.trainer.checkpoint import latest_checkpoint, list_checkpoints, load_loop_state
from agentlightning.trainer.tracking import METRICS_FILE, read_metrics

REPO = Path(__file__).resolve().parent.parent
KEY = "restart-key"
AGENT = "bench.restarts_agent:RestartProofAgent"
# Read by bench/restarts_trainer.py: the step in whose update / checkpoint save it kills itself.
KILL_IN_UPDATE, KILL_IN_SAVE = "AGL_BENCH_KILL_IN_UPDATE", "AGL_BENCH_KILL_IN_SAVE"


def gateway(port: int, db: Path, logs: Path, n: int | str) -> ManagedProcess:
    return start_gateway(
        port=port,
        key=KEY,
        store_url=f"sqlite:///{db}",
        log_level="warning",
        log_path=logs / f"gateway-{n}.log",
        cwd=REPO,
        ready_timeout=120,
    )


def controller(url: str, logs: Path, concurrency: int, n: int | str) -> ManagedProcess:
    return start_controller(
        url,
        key=KEY,
        max_agents=concurrency,
        log_dir=logs / "agents",
        log_level="warning",
        log_path=logs / f"controller-{n}.log",
        cwd=REPO,
        ready_timeout=120,
    )


def states(client: GatewayClient, ids: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for start in range(0, len(ids), 100):
        for item in client.get_events_batch(ids[start : start + 100], event_type="reward"):
            out[item["rollout_id"]] = item["state"] if item["found"] else "gone"
    return out


def services_phase(args: argparse.Namespace, logs: Path) -> None:
    """The Gateway and the Controller SIGKILLed mid-batch; this script plays the trainer."""
    port, fake_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    db = logs / "gateway.db"
    fake = ManagedProcess(
        "fake-model",
        [
            sys.executable,
            "-m",
            "tests.fakes.model_server",
            "--port",
            str(fake_port),
            "--delay",
            "0.05",
        ],
        logs / "fake.log",
        cwd=REPO,
    ).start()
    procs = {
        "gateway": gateway(port, db, logs, 0),
        "controller": controller(url, logs, args.concurrency, 0),
    }
    try:
        fake.wait_http_ok(f"http://127.0.0.1:{fake_port}/v1/models", timeout=60)
        with GatewayClient(url, KEY) as client:
            client.register_models([Model(model="policy", endpoint=f"http://127.0.0.1:{fake_port}/v1")])
            config = {
                "timeout_seconds": 300,
                "local": {"agent_class": AGENT, "env_map": {"QUESTION": "input.q"}},
            }
            ids = [f"r{i}" for i in range(args.rollouts)]
            created = client.create_rollouts(
                [
                    {"rollout_id": rid, "input": {"q": f"{i}+{i}?"}, "config": config}
                    for i, rid in enumerate(ids)
                ]
            )
            assert len(created) == len(ids)
            started = time.monotonic()
            # Kill points: by the share of the batch that is terminal.
            points = [((k + 1) / (args.gateway_kills + 2), "gateway") for k in range(args.gateway_kills)]
            points.insert(1 if points else 0, (0.45, "controller"))
            restarts = {"gateway": 0, "controller": 0}
            while True:
                try:
                    now = states(client, ids)
                except Exception:  # the Gateway is restarting: the client retried and gave up
                    time.sleep(0.5)
                    continue
                done = sum(s in ("succeeded", "failed") for s in now.values())
                if points and done >= points[0][0] * len(ids):
                    _, which = points.pop(0)
                    procs[which].kill()  # SIGKILL, whole process group
                    restarts[which] += 1
                    print(
                        f"  SIGKILL {which} at {done}/{len(ids)} terminal, t={time.monotonic() - started:.0f}s",
                        flush=True,
                    )
                    if which == "gateway":
                        procs[which] = gateway(port, db, logs, restarts[which])
                    else:
                        procs[which] = controller(url, logs, args.concurrency, restarts[which])
                    continue
                if done == len(ids) or time.monotonic() - started > args.deadline:
                    break
                time.sleep(0.5)
            final = states(client, ids)
            counts = Counter(final.get(rid, "gone") for rid in ids)
            lost = len(ids) - counts["succeeded"] - counts["failed"]
            print(
                f"\n{len(ids)} rollouts, Gateway SIGKILLed {restarts['gateway']}x, Controller "
                f"{restarts['controller']}x, in {time.monotonic() - started:.0f} s: "
                f"succeeded {counts['succeeded']}, failed {counts['failed']}, lost {lost} {dict(counts)}"
            )
            failures = Counter(
                (client.get_rollout(rid).rollout.status.error_message or "")[:160]
                for rid in ids
                if final.get(rid) == "failed"
            )
            for message, n in failures.most_common(5):
                print(f"  failed x{n}: {message}")
    finally:
        for proc in (procs["controller"], procs["gateway"], fake):
            proc.stop()


TRAIN_AGENT = "agentlightning.demo.agent:CalcAgent"
TRAIN_ENV = {"QUESTION": "input.question", "ANSWER": "input.answer"}
ACTIVE = [RolloutState.QUEUING, RolloutState.RUNNING]
LIST_ALL = 100_000


def trainer_config(out: Path, url: str, train: Path, args: argparse.Namespace) -> Path:
    """The trainer's config file: the tiny demo model, a checkpoint every step, rollouts kept."""
    cfg = {
        "data": {"train_files": str(train), "train_batch_size": args.train_batch, "seed": 0},
        "actor_rollout_ref": {
            "actor": {"ppo_mini_batch_size": args.train_batch, "optim": {"lr": 5e-4}},
            "rollout": {"n": args.train_group, "device": "cpu", "engine": "torch"},
        },
        "trainer": {
            "total_training_steps": args.train_steps,
            "save_freq": 1,
            "test_freq": 0,
            "val_before_train": False,
            "max_actor_ckpt_to_keep": 0,
            "experiment_name": out.name,
            "output_dir": str(out),
            "logger": ["jsonl"],
            "torch_threads": 1,
        },
        "agentlightning": {
            "agl_base_url": url,
            "agl_key": KEY,
            "keep_rollouts": True,  # each step's data stays readable on the Gateway
            "rollout_timeout_seconds": 300,
            "local": {"agent_class": TRAIN_AGENT, "env_map": TRAIN_ENV},
        },
    }
    path = out.with_suffix(".yaml")
    OmegaConf.save(OmegaConf.create(cfg), path)
    return path


def trainer(config: Path, logs: Path, name: str, env: dict[str, str] | None = None) -> ManagedProcess:
    """`agl-train` as bench/restarts_trainer.py runs it; `env` may ask it to kill itself."""
    full = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    argv = [sys.executable, "-m", "bench.restarts_trainer", "--config", str(config)]
    return ManagedProcess(name, argv, logs / f"{name}.log", env={**full, **(env or {})}, cwd=REPO).start()


def wait_exit(proc: ManagedProcess, timeout: float) -> int:
    assert proc.proc is not None
    try:
        return proc.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"{proc.name} did not finish within {timeout:.0f} s:\n{proc.log_tail()}") from None


def train_rollouts(client: GatewayClient) -> list[Rollout]:
    return [r for r in client.list_rollouts(limit=LIST_ALL) if r.is_train]


def run_of(rollout: Rollout) -> str | None:
    """The id of the trainer run that created `rollout` (the trainer's metadata key `run_id`)."""
    run = (rollout.metadata.model_extra or {}).get("run_id")
    return None if run is None else str(run)


def step_of(rollout: Rollout) -> int:
    """A train rollout's step: its `batch_idx`, which the trainer always sets."""
    if rollout.metadata.batch_idx is None:
        raise SystemExit(f"train rollout {rollout.rollout_id} has no batch_idx")
    return rollout.metadata.batch_idx


def new_run(client: GatewayClient, known: set[str]) -> str:
    """The run id (one per trainer process) that appeared since `known`; added to it."""
    runs = {run_of(r) for r in train_rollouts(client)} - known
    if len(runs) != 1:
        raise SystemExit(f"expected one new trainer run on the Gateway, found {sorted(map(str, runs))}")
    run = str(runs.pop())
    known.add(run)
    return run


def data_by_step(rollouts: list[Rollout], run: str) -> dict[int, list[str]]:
    """The problem ids of each step's groups, in batch order, as trainer `run` created them."""
    out: dict[int, dict[int, str]] = {}
    for r in rollouts:
        meta = r.metadata
        if run_of(r) == run and (meta.model_extra or {}).get("index_in_group") == 0:
            assert meta.sample_idx_in_batch is not None  # the trainer sets it with batch_idx
            out.setdefault(step_of(r), {})[meta.sample_idx_in_batch] = r.input["id"]
    return {step: [ids[i] for i in sorted(ids)] for step, ids in sorted(out.items())}


def states_of(rollouts: list[Rollout], run: str, step: int) -> Counter[str]:
    return Counter(
        r.status.state.value for r in rollouts if run_of(r) == run and r.metadata.batch_idx == step
    )


def resumed_step(proc: ManagedProcess) -> int:
    """The step the trainer said it resumed at (its `resumed` log line), 0 for a fresh start."""
    assert proc.log_path is not None
    match = re.search(
        r"event='resumed'.*?\bstep=(\d+)|\bstep=(\d+).*?event='resumed'", proc.log_path.read_text()
    )
    return int(match.group(1) or match.group(2)) if match else 0


def final_state(out: Path) -> tuple[int, int, int, int, list[int]]:
    """(step, model version, data position, optimizer steps) of the newest checkpoint, and the
    steps in metrics.jsonl."""
    from agentlightning.torch_backend.checkpoint import load_policy_state  # torch: only here

    latest = latest_checkpoint(out / "checkpoints")
    if latest is None:
        raise SystemExit(f"no checkpoint in {out}")
    state = load_loop_state(latest)
    optimizer_steps = int(load_policy_state(latest)["policy"]["steps"])
    logged = [int(r["step"]) for r in read_metrics(out / METRICS_FILE)]
    return int(state["step"]), int(state["version"]), int(state["data"]["position"]), optimizer_steps, logged


def says(counts: Counter[str]) -> str:
    return ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))


def trainer_phase(args: argparse.Namespace, logs: Path) -> None:
    """The real trainer SIGKILLed mid-step and resumed, beside an uninterrupted reference run."""
    steps, k_rollouts, k_update, k_save = (
        args.train_steps,
        args.kill_in_rollouts,
        args.kill_in_update,
        args.kill_in_save,
    )
    if not 1 <= k_rollouts < k_update <= steps or (k_save and not k_update < k_save <= steps):
        raise SystemExit(
            "need 1 <= --kill-in-rollouts < --kill-in-update < --kill-in-save (0: none) <= --train-steps"
        )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    train = logs / "train.jsonl"
    problems = make_dataset(steps * args.train_batch, seed=0, prefix="t")
    train.write_text("".join(json.dumps(p) + "\n" for p in problems))
    services = [
        gateway(port, logs / "trainer-gateway.db", logs, "trainer-phase"),
        controller(url, logs, args.concurrency, "trainer-phase"),
    ]
    per_step = args.train_batch * args.train_group
    print(
        f"\nTrainer phase: {steps} steps of {args.train_batch} problems x {args.train_group} rollouts "
        "(demo task, tiny model, the demo agent on the openai client), a checkpoint every step",
        flush=True,
    )
    procs: list[ManagedProcess] = []
    try:
        with GatewayClient(url, KEY) as client:
            known: set[str] = set()
            # The reference: the same config, uninterrupted.
            ref_out, out = logs / "reference", logs / "interrupted"
            started = time.monotonic()
            procs.append(trainer(trainer_config(ref_out, url, train, args), logs, "reference"))
            code = wait_exit(procs[-1], args.deadline)
            if code != 0:
                raise SystemExit(f"the reference run exited with {code}:\n{procs[-1].log_tail()}")
            ref_run = new_run(client, known)
            print(f"  reference run: {steps} steps, uninterrupted, in {time.monotonic() - started:.0f} s")

            config = trainer_config(out, url, train, args)
            checkpoints = out / "checkpoints"
            started = time.monotonic()
            # Trainer #1: SIGKILLed once the rollouts of step k_rollouts run (or, on a machine fast
            # enough to finish them between two looks, once a later step's exist).
            first = trainer(config, logs, "trainer-1")
            procs.append(first)
            deadline = time.monotonic() + args.deadline
            while True:
                if not first.alive():
                    raise SystemExit(f"trainer #1 exited before its kill:\n{first.log_tail()}")
                if time.monotonic() > deadline:
                    raise SystemExit(f"step {k_rollouts}'s rollouts never ran:\n{first.log_tail()}")
                mine = [r for r in train_rollouts(client) if run_of(r) not in known]
                if any(
                    step_of(r) > k_rollouts
                    or (step_of(r) == k_rollouts and r.status.state == RolloutState.RUNNING)
                    for r in mine
                ):
                    break
                time.sleep(0.1)
            first.kill()
            kill_step = max(step_of(r) for r in mine)
            newest = [max(list_checkpoints(checkpoints), default=0)]
            runs = [new_run(client, known)]
            print(
                f"  SIGKILL trainer #1 while step {kill_step}'s rollouts ran "
                f"({says(states_of(train_rollouts(client), runs[0], kill_step))}); newest complete "
                f"checkpoint: step {newest[0]}, t={time.monotonic() - started:.0f}s",
                flush=True,
            )
            # Then trainers that resume on the same folder and kill themselves at a known point.
            deaths = [(KILL_IN_UPDATE, k_update, "update, after the optimizer step")]
            if k_save:
                deaths.append(
                    (KILL_IN_SAVE, k_save, "checkpoint save, after the weights, before the loop state")
                )
            for variable, step, where in deaths:
                n = len(procs)
                proc = trainer(config, logs, f"trainer-{n}", {variable: str(step)})
                procs.append(proc)
                code = wait_exit(proc, args.deadline)
                if code != -signal.SIGKILL:
                    raise SystemExit(f"trainer #{n} exited with {code}, not SIGKILL:\n{proc.log_tail()}")
                newest.append(max(list_checkpoints(checkpoints), default=0))
                runs.append(new_run(client, known))
                partial = sorted(p.name for p in checkpoints.glob(".global_step_*"))
                print(
                    f"  SIGKILL trainer #{n} (by itself) in step {step}'s {where}; newest complete "
                    f"checkpoint: step {newest[-1]}{f', left behind: {partial}' if partial else ''}, "
                    f"t={time.monotonic() - started:.0f}s",
                    flush=True,
                )
            n = len(procs)
            last = trainer(config, logs, f"trainer-{n}")
            procs.append(last)
            code = wait_exit(last, args.deadline)
            if code != 0:
                raise SystemExit(f"trainer #{n} exited with {code}:\n{last.log_tail()}")
            runs.append(new_run(client, known))
            resumed = [resumed_step(proc) for proc in procs[2:]]

            # What the killed trainers had made goes on without them: wait until it has ended.
            deadline = time.monotonic() + args.deadline
            while client.list_rollouts(ACTIVE, limit=LIST_ALL) and time.monotonic() < deadline:
                time.sleep(0.5)
            rollouts = train_rollouts(client)
            reference = data_by_step(rollouts, ref_run)
            by_trainer = [data_by_step(rollouts, run) for run in runs]
            for n, (step, data) in enumerate(zip(resumed, by_trainer[1:], strict=True), 2):
                print(
                    f"  trainer #{n} resumed at step {step}; its first rollouts: step {min(data, default=0)}"
                )
            print(f"  finished in {time.monotonic() - started:.0f} s")
            print(f"\n  {'step':>4}  {'reference run':<40}  {'interrupted run (by trainer #)':<46}  same")
            same = 0
            for step in range(1, steps + 1):
                made = [n for n in range(len(runs)) if step in by_trainer[n]]
                used = made[-1] if made else None  # a redone step: the trainer that finished it
                theirs = by_trainer[used][step] if used is not None else []
                also = f" (also #{', #'.join(str(n + 1) for n in made[:-1])})" if len(made) > 1 else ""
                ok = theirs == reference.get(step)
                same += ok
                print(
                    f"  {step:>4}  {' '.join(reference.get(step, [])):<40}  "
                    f"{' '.join(theirs) + f'  #{(used or 0) + 1}' + also:<46}  {'yes' if ok else 'NO'}"
                )
            print()
            cut = [kill_step, *(step for _, step, _ in deaths)]
            for n, step in enumerate(cut):
                states = states_of(rollouts, runs[n], step)
                redo = "the same" if by_trainer[n].get(step) == by_trainer[n + 1].get(step) else "OTHER"
                print(
                    f"  trainer #{n + 1}'s step-{step} rollouts: {says(states)}"
                    f"{' (made before its kill, collected by no trainer)' if n == 0 else ', collected before it died'}"
                    f"; trainer #{n + 2} redid step {step} with {redo} problems"
                )
            ref_final, final = final_state(ref_out), final_state(out)
            for name, folder, (step, version, position, optimized, logged) in (
                ("reference", ref_out, ref_final),
                ("interrupted", out, final),
            ):
                partial = sorted(p.name for p in (folder / "checkpoints").glob(".global_step_*"))
                print(
                    f"  {name:<11} run: final step {step}, model version {version}, data position "
                    f"{position}, optimizer steps {optimized}, metrics.jsonl steps {logged}, "
                    f"partial checkpoints left {partial}"
                )
            # Every run's every step made per_step rollouts; lost: made but not terminal, or gone.
            expected = sum(len(d) for d in (reference, *by_trainer)) * per_step
            counts = Counter(r.status.state.value for r in rollouts)
            lost = expected - counts["succeeded"] - counts["failed"]
            print(
                f"\ntrainer phase: resumed at {resumed} (newest complete checkpoints {newest}); "
                f"data per step same as the reference: {same}/{steps}; final step {final[0]} version "
                f"{final[1]} (reference {ref_final[0]} {ref_final[1]}); {expected} rollouts: succeeded "
                f"{counts['succeeded']}, failed {counts['failed']}, lost {lost}",
                flush=True,
            )
            failures = Counter(
                (r.status.error_message or "")[:160]
                for r in rollouts
                if r.status.state == RolloutState.FAILED
            )
            for message, n in failures.most_common(5):
                print(f"  failed x{n}: {message}")
    finally:
        for proc in (*procs, *reversed(services)):
            proc.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--phase", choices=("all", "services", "trainer"), default="all")
    parser.add_argument("--rollouts", type=int, default=300, help="services phase: the batch")
    parser.add_argument("--concurrency", type=int, default=16, help="agents at once")
    parser.add_argument("--gateway-kills", type=int, default=2)
    parser.add_argument("--deadline", type=float, default=900, help="seconds to wait for a batch or a run")
    parser.add_argument("--train-steps", type=int, default=6)
    parser.add_argument("--train-batch", type=int, default=4, help="problems per step")
    parser.add_argument("--train-group", type=int, default=4, help="rollouts per problem")
    parser.add_argument("--kill-in-rollouts", type=int, default=2, help="SIGKILL trainer #1 in this step")
    parser.add_argument("--kill-in-update", type=int, default=4, help="trainer #2 dies in this step's update")
    parser.add_argument(
        "--kill-in-save", type=int, default=5, help="trainer #3 dies saving this step's checkpoint (0: no)"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="agl-restarts-") as tmp_dir:
        logs = Path(tmp_dir)
        if args.phase in ("all", "services"):
            services_phase(args, logs)
        if args.phase in ("all", "trainer"):
            trainer_phase(args, logs)


if __name__ == "__main__":
    main()
