"""Small helpers of the vLLM tests."""

from __future__ import annotations

import os


def process_group_alive(pgid: int) -> bool:
    """Whether any process of group `pgid` is still running (zombies do not count)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False
