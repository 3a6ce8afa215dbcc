"""An agent module that starts a thread at import: it cannot be forked safely, so the controller
runs it in a fresh interpreter."""

from __future__ import annotations

import os
import threading
import time

from tests.controller.agents import reward

IMPORT_PID = os.getpid()
_ticker = threading.Thread(target=lambda: time.sleep(3600), daemon=True)
_ticker.start()


class ThreadedAgent:
    def run(self) -> None:
        reward(1.0, pid=os.getpid(), import_pid=IMPORT_PID)
