"""Agents the controller tests run. Each reads the AGL_* environment like a real agent would."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

IMPORT_PID = os.getpid()  # differs from the running pid when the module was preloaded by a warm process


def post_event(event_type: str, data: dict) -> None:
    request = urllib.request.Request(
        os.environ["AGL_EVENT_URL"],
        data=json.dumps({"event_type": event_type, "data": data}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {os.environ['AGL_KEY']}"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()


def reward(value: float, **extra: object) -> None:
    post_event("reward", {"value": value, **extra})


def _info() -> dict:
    return {
        "pid": os.getpid(),
        "import_pid": IMPORT_PID,
        "pgid": os.getpgid(0),
        "sid": os.getsid(0),
        "question": os.environ.get("QUESTION"),
        "number": os.environ.get("NUMBER"),
        "base_url": os.environ.get("AGL_OPENAI_BASE_URL"),
        "random": random.random(),
        "argv": sys.argv,
    }


class RewardAgent:
    """Posts reward 1.0 with facts about its process, prints a line."""

    def run(self) -> None:
        print(f"reward agent running in {os.getpid()}")
        reward(1.0, **_info())


class AsyncRewardAgent:
    async def run(self) -> None:
        await asyncio.sleep(0)
        reward(0.5, **_info())


class CrashAgent:
    def run(self) -> None:
        print("about to fail")
        raise RuntimeError("the agent broke on purpose")


class ExitCodeAgent:
    def run(self) -> None:
        sys.exit(3)


class SleepAgent:
    """Starts a grandchild, records both pids in $PID_FILE, then sleeps until killed."""

    def run(self) -> None:
        child = subprocess.Popen(["sleep", "1000"])
        Path(os.environ["PID_FILE"]).write_text(f"{os.getpid()} {child.pid}")
        time.sleep(1000)


def _record_pid_and_wait_for_go() -> None:
    """Write our pid to $PID_FILE, then wait (at most a minute) until $GO_FILE exists."""
    Path(os.environ["PID_FILE"]).write_text(str(os.getpid()))
    go = Path(os.environ["GO_FILE"])
    deadline = time.time() + 60
    while not go.exists() and time.time() < deadline:
        time.sleep(0.05)


class WaitForFileAgent:
    """Records its pid in $PID_FILE, waits until $GO_FILE exists, then posts a reward."""

    def run(self) -> None:
        _record_pid_and_wait_for_go()
        reward(1.0, **_info())


class FlakyAgent:
    """First attempt: records its pid and waits to be killed from outside (like the OOM killer);
    later attempts: post a reward at once."""

    def run(self) -> None:
        marker = Path(os.environ["PID_FILE"])
        if not marker.exists():
            marker.write_text(str(os.getpid()))
            time.sleep(1000)
        reward(1.0, **_info())


class SegfaultAgent:
    def run(self) -> None:
        os.kill(os.getpid(), signal.SIGSEGV)


class NoRun:
    pass


class WaitThenExitAgent:
    """Records its pid in $PID_FILE, waits for $GO_FILE, exits 0 without talking to the Gateway."""

    def run(self) -> None:
        _record_pid_and_wait_for_go()


def _call(method: str, url: str, body: object = None) -> int:
    """Status of one request with this agent's AGL_KEY."""
    request = urllib.request.Request(
        url,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {os.environ['AGL_KEY']}"},
        method=method,
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


class HostileAgent:
    """Untrusted code with its AGL_KEY: tries what an attacker would, reports the answers it got.

    The victim rollout's id comes in VICTIM (env_map)."""

    def run(self) -> None:
        gateway = os.environ["AGL_EVENT_URL"].split("/api/rollouts/")[0]
        victim = os.environ["VICTIM"]
        victim_attempt = os.environ["VICTIM_ATTEMPT"]
        tries = {
            "list": _call("GET", f"{gateway}/api/rollouts"),
            "read_victim": _call("GET", f"{gateway}/api/rollouts/{victim}/events"),
            "delete_victim": _call("DELETE", f"{gateway}/api/rollouts/{victim}"),
            "reward_victim": _call(
                "POST",
                f"{gateway}/api/rollouts/{victim}/attempt/{victim_attempt}/events",
                {"event_type": "reward", "data": {"value": -100.0}},
            ),
            "register_model": _call(
                "POST", f"{gateway}/api/models", [{"model": "policy", "endpoint": "http://127.0.0.1:9/v1"}]
            ),
            "pause": _call("POST", f"{gateway}/proxy/pause", {"retry_after_seconds": 60}),
            "mint": _call("POST", f"{gateway}/api/agent-tokens", {"rollout_id": victim, "attempt_id": "x"}),
            "victim_proxy": _call(
                "POST",
                f"{gateway}/proxy/rollout/{victim}/attempt/{victim_attempt}/mode/train/openai/v1/chat/completions",
                {"messages": [{"role": "user", "content": "leak"}]},
            ),
        }
        reward(1.0, tries=tries, key_prefix=os.environ["AGL_KEY"].split(".")[0])


class NaiveAgent:
    """A naive agent (docs/reliability.md): one model call, then what $BEHAVIOUR says. A model
    call that fails is caught and reported as reward 0, as most agents do.

    ok: reward 1; model_error: a second call (the question + " fail"), reward 0 when it fails;
    exit: exit 1; silent: no reward; killed: SIGKILL itself, as the kernel's OOM killer does at
    a memory limit (the local runner sets none: the signal is what the controller sees)."""

    def _chat(self, content: str) -> int:
        url = os.environ["AGL_OPENAI_BASE_URL"] + "/chat/completions"
        return _call("POST", url, {"model": "m", "messages": [{"role": "user", "content": content}]})

    def run(self) -> None:
        behaviour = os.environ["BEHAVIOUR"]
        question = os.environ.get("QUESTION", "what is two plus two")
        if self._chat(question) != 200:
            reward(0.0)
            return
        if behaviour == "model_error":
            reward(1.0 if self._chat(question + " fail") == 200 else 0.0)
        elif behaviour == "exit":
            sys.exit(1)
        elif behaviour == "killed":
            os.kill(os.getpid(), signal.SIGKILL)
        elif behaviour == "ok":
            reward(1.0)
