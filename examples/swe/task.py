"""A coding task in the SWE-bench / SWE-smith instance format, and a loader for their JSONL.

The fields are SWE-bench's (`instance_id`, `repo`, `base_commit`, `patch`, `test_patch`,
`problem_statement`, `FAIL_TO_PASS`, `PASS_TO_PASS`, `environment_setup_commit`, `version`) plus
SWE-smith's `image_name`. `FAIL_TO_PASS` / `PASS_TO_PASS` are lists of pytest node ids (SWE-bench
stores them as JSON strings; both are read). Tasks of the local bank also carry `files`: the
repository snapshot the agent starts from (path -> text), so they need neither git nor an image.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Task:
    instance_id: str
    repo: str
    problem_statement: str
    patch: str  # the reference fix, a unified diff
    test_patch: str  # adds the hidden tests, a unified diff
    FAIL_TO_PASS: tuple[str, ...]
    PASS_TO_PASS: tuple[str, ...]
    base_commit: str = ""
    environment_setup_commit: str = ""
    version: str = ""
    image_name: str = ""  # SWE-smith: the image holding the repository at base_commit
    files: dict[str, str] = field(default_factory=dict)  # local bank: the snapshot the agent sees
    hidden_files: dict[str, str] = field(default_factory=dict)  # local bank: test_patch's files
    family: str = ""  # local bank: the injected bug's family

    def to_json(self) -> dict:
        data = asdict(self)
        data["FAIL_TO_PASS"] = list(self.FAIL_TO_PASS)
        data["PASS_TO_PASS"] = list(self.PASS_TO_PASS)
        return data


_REQUIRED = ("instance_id", "problem_statement", "FAIL_TO_PASS", "PASS_TO_PASS")


def _test_ids(value, key: str, line: int) -> tuple[str, ...]:
    if isinstance(value, str):  # SWE-bench: a JSON-encoded list
        value = json.loads(value)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"line {line}: {key} must be a list of test ids")
    return tuple(value)


def task_from_json(data: dict, line: int = 0) -> Task:
    """One SWE-bench / SWE-smith instance (a JSON object) as a Task; unknown keys are ignored."""
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise ValueError(f"line {line}: instance lacks {', '.join(missing)}")
    return Task(
        instance_id=str(data["instance_id"]),
        repo=str(data.get("repo", "")),
        problem_statement=str(data["problem_statement"]),
        patch=str(data.get("patch", "")),
        test_patch=str(data.get("test_patch", "")),
        FAIL_TO_PASS=_test_ids(data["FAIL_TO_PASS"], "FAIL_TO_PASS", line),
        PASS_TO_PASS=_test_ids(data["PASS_TO_PASS"], "PASS_TO_PASS", line),
        base_commit=str(data.get("base_commit", "")),
        environment_setup_commit=str(data.get("environment_setup_commit", "")),
        version=str(data.get("version", "")),
        image_name=str(data.get("image_name", "")),
        files=dict(data.get("files") or {}),
        hidden_files=dict(data.get("hidden_files") or {}),
        family=str(data.get("family", "")),
    )


def load_jsonl(path: str | Path) -> Iterator[Task]:
    """Tasks from a SWE-bench / SWE-smith JSONL file (one instance a line; blank lines skipped)."""
    with open(path, encoding="utf-8") as f:
        for n, raw in enumerate(f, 1):
            if raw.strip():
                try:
                    data = json.loads(raw)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}: line {n} is not JSON: {e}") from e
                yield task_from_json(data, n)
