"""Grade an agent's workspace: its changes on a fresh copy of the task, the hidden tests put back.

What the agent leaves in its workspace is read, never run there. The grader
  1. writes a fresh copy of the task repository (the snapshot the agent started from);
  2. carries over the agent's changes (added, modified, deleted files) except test-harness files:
     anything under tests/, conftest.py, pytest.ini, tox.ini, setup.cfg, setup.py, pyproject.toml,
     sitecustomize.py, usercustomize.py, *.pth, .git; symbolic links are not followed;
  3. adds the hidden tests and runs FAIL_TO_PASS + PASS_TO_PASS with pytest under a timeout, in the
     bubblewrap sandbox when it is available (no network; the run sees only the copy), with `-P`
     so that nothing in the repository's root can shadow pytest itself;
  4. reward 1 only when every one of those tests passed (`partial=True`: the fraction that passed),
     0 on a timeout, a crash or a test missing from the report.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from agentlightning.sandbox import Sandbox, available, python_paths
from examples.swe.task import Task

HARNESS_NAMES = frozenset(
    {
        "conftest.py",
        "pytest.ini",
        "tox.ini",
        "setup.cfg",
        "setup.py",
        "pyproject.toml",
        "sitecustomize.py",
        "usercustomize.py",
    }
)
_SKIP_DIRS = frozenset({"__pycache__", ".pytest_cache", ".git", ".mypy_cache", ".ruff_cache"})
MAX_FILE_BYTES = 1_000_000
_REPORT = ".agl-junit.xml"


def is_protected(rel: str) -> bool:
    """True for test and test-harness files: the agent's version of them is never graded."""
    path = PurePosixPath(rel)
    return (
        path.parts[0] == "tests"
        or path.name in HARNESS_NAMES
        or path.suffix == ".pth"
        or any(part in _SKIP_DIRS for part in path.parts)
        or path.name == _REPORT
    )


@dataclass
class Grade:
    instance_id: str
    reward: float
    resolved: bool
    timed_out: bool = False
    FAIL_TO_PASS: dict[str, str] = field(default_factory=dict)  # test id -> passed|failed|error|missing
    PASS_TO_PASS: dict[str, str] = field(default_factory=dict)
    ignored: list[str] = field(default_factory=list)  # the agent's changes to protected files
    sandboxed: bool = False
    log_tail: str = ""


def _workspace_files(workdir: Path) -> dict[str, bytes]:
    files = {}
    for root, dirs, names in os.walk(workdir, followlinks=False):
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS and not Path(root, d).is_symlink()]
        for name in names:
            path = Path(root, name)
            if path.is_symlink() or not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
                continue
            files[path.relative_to(workdir).as_posix()] = path.read_bytes()
    return files


def apply_workspace(task: Task, workdir: Path, fresh: Path) -> list[str]:
    """Write the task's snapshot into `fresh` with the agent's allowed changes; returns the ignored ones."""
    original = {k: v.encode() for k, v in task.files.items()}
    agent = _workspace_files(workdir)
    ignored = []
    result = dict(original)
    for rel in sorted(set(original) | set(agent)):
        if agent.get(rel) == original.get(rel):
            continue
        if is_protected(rel):
            ignored.append(rel)
        elif rel in agent:
            result[rel] = agent[rel]
        else:
            del result[rel]
    for rel, data in result.items():
        target = fresh / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    for rel, text in task.hidden_files.items():
        (fresh / rel).write_text(text)
    return ignored


def _outcomes(report: Path) -> dict[str, str]:
    try:
        tree = ET.parse(report)
    except (OSError, ET.ParseError):
        return {}
    out = {}
    for case in tree.iter("testcase"):
        file = case.get("file") or case.get("classname", "").replace(".", "/") + ".py"
        node = f"{file}::{case.get('name')}"
        kinds = {child.tag for child in case}
        out[node] = (
            "failed"
            if "failure" in kinds
            else "error"
            if "error" in kinds
            else "skipped"
            if "skipped" in kinds
            else "passed"
        )
    return out


def grade(
    task: Task,
    workdir: str | Path,
    *,
    timeout: float = 120.0,
    partial: bool = False,
    python: str = sys.executable,
    sandbox: bool | None = None,
) -> Grade:
    """Grade `workdir` against `task` (see the module's docstring). `sandbox=None`: when available."""
    if not task.files:
        raise ValueError(f"{task.instance_id}: no repository snapshot (an image task: grade it in its image)")
    use_sandbox = available() if sandbox is None else sandbox
    tests = [*task.FAIL_TO_PASS, *task.PASS_TO_PASS]
    with tempfile.TemporaryDirectory(prefix="agl-grade-") as tmp:
        fresh = Path(tmp, "repo")
        fresh.mkdir()
        ignored = apply_workspace(task, Path(workdir), fresh)
        command = [python, "-P", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                   f"--junitxml={_REPORT}", "-o", "junit_family=xunit1", *tests]  # fmt: skip
        # No plugin from the interpreter's site-packages: only pytest itself judges.
        env = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
        if use_sandbox:
            box = Sandbox(workspace=fresh, read_only=python_paths(python), env=env)
            run = box.run(command, timeout=timeout)
            timed_out, log = run.timed_out, run.stdout + run.stderr
        else:
            try:
                done = subprocess.run(
                    command, cwd=fresh, env={"PATH": os.environ.get("PATH", ""), **env},
                    capture_output=True, text=True, timeout=timeout, start_new_session=True,
                )  # fmt: skip
                timed_out, log = False, done.stdout + done.stderr
            except subprocess.TimeoutExpired as e:
                timed_out, log = True, str(e.stdout or "")
        outcomes = {} if timed_out else _outcomes(fresh / _REPORT)
        shutil.rmtree(fresh, ignore_errors=True)
    f2p = {t: outcomes.get(t, "missing") for t in task.FAIL_TO_PASS}
    p2p = {t: outcomes.get(t, "missing") for t in task.PASS_TO_PASS}
    passed = sum(v == "passed" for v in [*f2p.values(), *p2p.values()])
    resolved = passed == len(tests) and not timed_out
    reward = 1.0 if resolved else (passed / len(tests) if partial and tests and not timed_out else 0.0)
    return Grade(task.instance_id, reward, resolved, timed_out, f2p, p2p, ignored, use_sandbox, log[-2000:])
