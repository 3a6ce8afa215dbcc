"""Agent log retention: a run of a million rollouts must not leave a million log files.

Logs of failed attempts (the ones someone reads) and of the others are kept in two budgets,
oldest deleted first. A failed attempt's log gets a `{attempt}.failed` marker beside it, so a
restarted controller sorts the logs it finds on disk into the same two budgets.
"""

from __future__ import annotations

import contextlib
import os
from collections import deque
from pathlib import Path

from agentlightning.log import get_logger

log = get_logger("controller.logs")
FAILED_SUFFIX = ".failed"
WARM_DIR = "_warm"  # the warm processes' own logs: not per attempt, not ours to delete


class LogRetention:
    """`keep`, `keep_failed`: how many logs of each kind stay; -1 keeps all."""

    def __init__(self, log_dir: Path, keep: int, keep_failed: int) -> None:
        self.log_dir = log_dir
        self.keep = keep
        self.keep_failed = keep_failed
        self._kept: deque[Path] = deque()
        self._kept_failed: deque[Path] = deque()

    def load(self) -> None:
        """Enrol the logs already on disk (a restart), oldest first."""
        found: list[tuple[float, Path, bool]] = []
        with contextlib.suppress(FileNotFoundError):
            for rollout_dir in self.log_dir.iterdir():
                if rollout_dir.name == WARM_DIR or not rollout_dir.is_dir():
                    continue
                for path in rollout_dir.glob("*.log"):
                    with contextlib.suppress(FileNotFoundError):
                        failed = path.with_suffix(FAILED_SUFFIX).exists()
                        found.append((path.stat().st_mtime, path, failed))
        for _, path, failed in sorted(found):
            (self._kept_failed if failed else self._kept).append(path)
        self._trim()

    def finished(self, log_path: Path, failed: bool) -> None:
        """An attempt is over and reported: its log now counts against its budget."""
        if failed:
            with contextlib.suppress(OSError):
                log_path.with_suffix(FAILED_SUFFIX).touch()
        (self._kept_failed if failed else self._kept).append(log_path)
        self._trim()

    def _trim(self) -> None:
        for paths, limit in ((self._kept, self.keep), (self._kept_failed, self.keep_failed)):
            while limit >= 0 and len(paths) > limit:
                self._delete(paths.popleft())

    def _delete(self, path: Path) -> None:
        for p in (path, path.with_suffix(FAILED_SUFFIX)):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
        with contextlib.suppress(OSError):  # the rollout's directory, once empty
            os.rmdir(path.parent)
