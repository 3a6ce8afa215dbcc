"""The command lines' one way to stop (`config/loader.py`): Ctrl-C or SIGTERM → cleanup → exit 130,
also when a library swallowed the KeyboardInterrupt, and also when SIGINT was inherited ignored."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.process  # whole processes, waited on: not in `make test-fast`

SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    from agentlightning.config.loader import catch_interrupts, exit_on_interrupt

    catch_interrupts()
    with exit_on_interrupt("prog", "stopped here", cleanup=lambda: print("cleaned", flush=True)):
        try:
            os.kill(os.getpid(), getattr(signal, sys.argv[1]))
        except KeyboardInterrupt:
            if sys.argv[2] == "swallow":  # as some libraries' loops do
                pass
            else:
                raise
        print("went on", flush=True)
    print("finished", flush=True)
    """
)


@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("swallow", ["swallow", "raise"])
def test_a_signal_ends_the_run_with_130_after_cleanup(name: str, swallow: str) -> None:
    # SIGINT ignored by the parent, as a non-interactive shell's background job starts a process.
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, name, swallow],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    assert result.returncode == 130, result
    assert "cleaned" in result.stdout and "finished" not in result.stdout
    assert ("went on" in result.stdout) == (swallow == "swallow")
    assert result.stderr.strip().endswith("prog: stopped here")


def test_no_signal_no_exit() -> None:
    script = SCRIPT.replace("os.kill(os.getpid(), getattr(signal, sys.argv[1]))", "pass")
    result = subprocess.run(
        [sys.executable, "-c", script, "SIGINT", "raise"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result
    assert result.stdout.split() == ["went", "on", "finished"]
