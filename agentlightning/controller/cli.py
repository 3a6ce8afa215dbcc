"""`agl-controller`: arrives with the controller issue."""

from __future__ import annotations

import sys


def main() -> None:
    print("agl-controller: not yet available in this version", file=sys.stderr)
    raise SystemExit(1)
