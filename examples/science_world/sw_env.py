"""One ScienceWorld simulator in its own JVM, for one rollout, tracked by its process id.

AllenAI's `scienceworld` package starts a JVM (py4j's `GatewayServer` over the package's own
`scienceworld.jar`) for each `ScienceWorldEnv`. A rollout owns exactly one: `close()` ends it and
waits for it to be gone (SIGKILL after a grace period), and it cannot outlive its rollout
otherwise either: it is in the agent's process group, which the Controller kills when the agent
ends or times out, and py4j starts it with `--die-on-broken-pipe`, so it exits when the agent
process dies and its stdin closes.

`step()` asks the simulator for the observation, score and completion only. The package's own
`step()` also computes every valid action-object combination on each step (about 85 % of a
step's time, measured in docs/examples.md) for an `info` the agent never shows the model.
The end-of-episode rules are the package's: completed, a negative score (a failed task), or
more moves than `env_step_limit`.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# ScienceWorld's JVM defaults (a quarter of the machine's memory as heap, the parallel collector,
# both JIT tiers) let one simulator grow past 1 GiB and spend its first seconds compiling. A
# 512 MiB heap, the serial collector and the quick JIT tier only suit a short-lived simulator of
# one episode (measured in examples/science_world/README.md).
DEFAULT_JAVA_OPTIONS = "-Xmx512m -XX:+UseSerialGC -XX:TieredStopAtLevel=1"
SIMPLIFICATIONS = (
    "easy",
    "teleportAction",
    "selfWateringFlowerPots",
    "openContainers",
    "openDoors",
    "noElectricalAction",
)


@dataclass(frozen=True)
class Step:
    observation: str
    score: int  # ScienceWorld's score, 0..100 (-100 when the task failed)
    done: bool
    moves: int


def process_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks (/proc/PID/stat field 22): with the pid it names one
    process, so that a reused pid is never taken for the JVM."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(") ", 1)[1].split()[19])


class ScienceWorldSession:
    """`with ScienceWorldSession(...) as env:` starts the JVM, loads the task and resets it."""

    def __init__(
        self,
        task_name: str,
        variation_idx: int,
        simplification: str = "easy",
        env_step_limit: int = 100,
        java_options: str = DEFAULT_JAVA_OPTIONS,
        close_timeout: float = 10.0,
    ) -> None:
        for part in filter(None, simplification.split(",")):
            if part not in SIMPLIFICATIONS:
                raise ValueError(f"unknown simplification {part!r}; known: {', '.join(SIMPLIFICATIONS)}")
        if env_step_limit < 1:
            raise ValueError(f"env_step_limit must be >= 1, got {env_step_limit}")
        self.task_name = task_name
        self.variation_idx = variation_idx
        self.simplification = simplification
        self.env_step_limit = env_step_limit
        self.java_options = java_options
        self.close_timeout = close_timeout
        self.jvm_pid: int | None = None
        self.jvm_ticks: int | None = None
        self.start_seconds = 0.0
        self._env: Any = None
        self._process: Any = None

    def start(self) -> ScienceWorldSession:
        from scienceworld import ScienceWorldEnv

        started = time.monotonic()
        # The package starts the JVM itself; JAVA_TOOL_OPTIONS is how its heap is set.
        previous = os.environ.get("JAVA_TOOL_OPTIONS")
        if self.java_options:
            os.environ["JAVA_TOOL_OPTIONS"] = self.java_options
        try:
            self._env = ScienceWorldEnv("", envStepLimit=self.env_step_limit)
        finally:
            if previous is None:
                os.environ.pop("JAVA_TOOL_OPTIONS", None)
            else:
                os.environ["JAVA_TOOL_OPTIONS"] = previous
        self._process = self._env._gateway.java_process
        self.jvm_pid = self._process.pid
        self.jvm_ticks = process_start_ticks(self.jvm_pid)
        try:
            names = list(self._env.get_task_names())
            if self.task_name not in names:
                raise ValueError(f"unknown ScienceWorld task {self.task_name!r}; tasks: {', '.join(names)}")
            limit = int(self._env.get_max_variations(self.task_name))
            if not 0 <= self.variation_idx < limit:
                raise ValueError(
                    f"variation {self.variation_idx} of {self.task_name!r} does not exist (0..{limit - 1})"
                )
            self._env.load(self.task_name, self.variation_idx, self.simplification)
        except BaseException:
            self.close()
            raise
        self.start_seconds = time.monotonic() - started
        return self

    @property
    def server(self) -> Any:
        if self._env is None:
            raise RuntimeError("the ScienceWorld session is not started")
        return self._env.server

    def reset(self) -> Step:
        """Back to the first move; the observation of `look around`, as the package's reset."""
        self.server.reset()
        return self.step("look around")

    def step(self, action: str) -> Step:
        server = self.server
        observation = str(server.step(action))
        score = round(100 * float(server.getScore()))
        moves = int(server.getNumMoves())
        done = bool(server.getCompleted()) or score < 0 or moves > self.env_step_limit
        return Step(observation, score, done, moves)

    def task_description(self) -> str:
        return str(self.server.getTaskDescription())

    def inventory(self) -> str:
        return str(self.server.freeActionInventory())

    def action_templates(self) -> list[str]:
        return [str(a) for a in self.server.getPossibleActions()]

    def close(self) -> None:
        """End the JVM and wait until it is gone: the package's shutdown first, then SIGKILL."""
        env, process, self._env = self._env, self._process, None
        if env is not None:
            with contextlib.suppress(Exception):  # a JVM already gone: nothing to shut down
                env.close()
        if process is not None:
            try:
                process.wait(self.close_timeout)
            except Exception:
                process.kill()
                process.wait(self.close_timeout)

    def __enter__(self) -> ScienceWorldSession:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
