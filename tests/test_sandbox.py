"""The bubblewrap sandbox (agentlightning/sandbox.py), with the real bwrap: what a command can and cannot do."""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from agentlightning.sandbox import Sandbox, available, python_paths


def _need_bwrap() -> None:
    if not available():
        if os.environ.get("CI"):
            pytest.fail("bubblewrap must work on CI (apt-get install -y bubblewrap)")
        pytest.skip("bubblewrap is not installed here")


@pytest.fixture
def box(tmp_path: Path) -> Sandbox:
    _need_bwrap()
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "hello.txt").write_text("hi\n")
    return Sandbox(workspace=ws, read_only=python_paths(sys.executable), env={"GREETING": "yes"})


def _py(box: Sandbox, code: str, timeout: float = 60):
    return box.run([sys.executable, "-c", code], timeout=timeout)


def test_workspace_is_readable_and_writable_and_the_cwd(box: Sandbox) -> None:
    r = _py(
        box,
        "import os; print(os.getcwd()); print(open('hello.txt').read().strip()); open('new','w').write('x')",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["/workspace", "hi"]
    assert (box.workspace / "new").read_text() == "x"


def test_only_the_given_environment(box: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGL_SECRET_TEST", "leak")
    r = _py(box, "import os; print(os.environ.get('GREETING'), os.environ.get('AGL_SECRET_TEST'))")
    assert r.stdout.split() == ["yes", "None"]


def test_the_callers_environment_is_not_readable_through_proc(
    box: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    # bwrap is PID 1 in the sandbox's PID namespace: its environ must not hold the caller's secrets.
    monkeypatch.setenv("AGL_SECRET_TEST", "leak-through-proc")
    r = box.run(["sh", "-c", "cat /proc/1/environ /proc/self/environ; echo; echo end"], timeout=30)
    assert r.stdout.rstrip().endswith("end"), r.stderr
    assert "leak-through-proc" not in r.stdout + r.stderr


def test_host_files_outside_are_invisible_or_read_only(box: Sandbox, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    r = box.run(
        ["sh", "-c", f"cat {outside}; echo gone > {outside}; touch /usr/agl_probe; echo x > /etc/passwd"],
        timeout=30,
    )
    assert r.returncode != 0
    assert "secret" not in r.stdout
    assert outside.read_text() == "secret"
    assert not Path("/usr/agl_probe").exists()
    assert "Read-only file system" in r.stderr
    # The Python prefix bound for the interpreter is read-only too (no `pip install` into it).
    prefix = python_paths(sys.executable)[-1]
    r = box.run(["sh", "-c", f"touch {prefix}/agl_probe"], timeout=30)
    assert r.returncode != 0 and not (prefix / "agl_probe").exists()


def test_a_mount_is_writable_at_its_inside_path_and_its_host_path_is_not_there(
    box: Sandbox, tmp_path: Path
) -> None:
    home = tmp_path / "agl-home-x7q2"  # a temporary folder's random name: never seen inside
    home.mkdir()
    (home / "config.toml").write_text("model = 'policy'\n")
    mounted = replace(box, mounts={"/home/agent": home})
    r = mounted.run(
        ["sh", "-c", f"cat /home/agent/config.toml; echo made > /home/agent/new; ls {home}"], timeout=30
    )
    assert r.stdout.splitlines()[0] == "model = 'policy'", r.stderr
    assert (home / "new").read_text() == "made\n"
    assert r.returncode != 0 and "No such file" in r.stderr  # the host path is not there


def test_an_interpreter_under_tmp_runs_and_stays_read_only(tmp_path: Path) -> None:
    """A checkout under /tmp (a CI clone, pytest's tmp_path): the private /tmp must not hide it."""
    _need_bwrap()
    venv = tmp_path / "venv"  # under /tmp: pytest's base temp folder
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    ws = tmp_path / "ws"
    ws.mkdir()
    box = Sandbox(workspace=ws, read_only=python_paths(python))
    r = box.run([python, "-c", "import sys; print(sys.prefix)"], timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(venv)
    r = box.run(["sh", "-c", f"touch {venv}/agl_probe"], timeout=30)
    assert r.returncode != 0 and not (venv / "agl_probe").exists()


def test_no_network_not_even_the_hosts_loopback(box: Sandbox) -> None:
    class Ok(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        # Reachable from here...
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        # ...refused inside: the sandbox has its own, empty loopback; no route anywhere else.
        code = (
            "import socket\n"
            f"for addr in [('127.0.0.1', {port}), ('1.1.1.1', 80)]:\n"
            "    try:\n"
            "        socket.create_connection(addr, timeout=3); print('connected')\n"
            "    except OSError as e:\n"
            "        print(type(e).__name__)\n"
        )
        r = _py(box, code)
        assert r.returncode == 0, r.stderr
        assert "connected" not in r.stdout
        assert len(r.stdout.split()) == 2
    finally:
        server.shutdown()


def _alive_in(namespace: str) -> list[str]:
    """Host pids of the live processes in a PID namespace (`pid:[…]`, as the sandbox read it).

    Zombies are not counted: the namespace's exited init waits there for this machine's PID 1 to
    reap it, and holds nothing.
    """
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                same = os.readlink(proc / "ns" / "pid") == namespace
                state = (proc / "stat").read_text().rsplit(") ", 1)[1][0]
            except (OSError, IndexError):
                continue
            if same and state != "Z":
                found.append(proc.name)
    return found


# Print the command's PID namespace, then leave a background child holding 100 MB: its exit takes
# the kernel a moment (freeing the memory), widening the window in which bwrap has already exited
# while the namespace is still being torn down. The command goes on once the child holds it.
_LEAVE_A_CHILD = (
    "rm -f held; readlink /proc/self/ns/pid; nohup {python} -c "
    "\"b = bytearray(100 * 2**20); b[::4096] = b'x' * len(b[::4096]); open('held', 'w').close(); "
    'import time; time.sleep(300)" >/dev/null 2>&1 & '
    "until [ -e held ]; do sleep 0.05; done; {then}"
)


def test_timeout_kills_everything_the_command_started(box: Sandbox) -> None:
    # The child daemonizes (setsid) and the command outwaits its timeout: killing bwrap's process
    # group kills the namespace's init, and the kernel every process of the namespace with it.
    command = _LEAVE_A_CHILD.format(python=f"setsid {sys.executable}", then="sleep 300")
    r = box.run(["sh", "-c", command], timeout=3)
    assert r.timed_out
    assert _alive_in(r.stdout.split()[0]) == []


def test_commands_that_end_leave_nothing_behind(box: Sandbox) -> None:
    # `run` returns once the namespace is gone, not when bwrap exits (bwrap reports the command's
    # status before the kernel has killed what it left): ten rounds, none may leave a process
    # (without that wait, every run of this test failed here).
    for round in range(10):
        r = box.run(
            ["sh", "-c", _LEAVE_A_CHILD.format(python=sys.executable, then="echo started")], timeout=60
        )
        namespace, said = r.stdout.split()
        assert said == "started" and not r.timed_out, r.stderr
        assert _alive_in(namespace) == [], f"round {round}"


def test_a_caller_with_many_open_files_still_waits(box: Sandbox) -> None:
    # A Controller running many agents holds many descriptors: the namespace's pidfd then gets a
    # number past 1024, which select() cannot wait on.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        r = box.run(["sh", "-c", "echo done"], timeout=30)
        assert r.stdout.strip() == "done" and r.returncode == 0, r.stderr
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_sandbox_that_cannot_start_says_why(box: Sandbox) -> None:
    # bwrap fails before creating the namespace: no init to wait for, its own error is the result.
    broken = Sandbox(workspace=box.workspace, read_only=(box.workspace / "missing",))
    r = broken.run(["true"], timeout=30)
    assert r.returncode != 0 and "missing" in r.stderr


def test_cannot_see_or_signal_processes_outside(box: Sandbox) -> None:
    r = box.run(
        ["sh", "-c", f"kill -0 {os.getpid()} && echo visible; ls /proc | grep -c '^[0-9]'"], timeout=30
    )
    assert "visible" not in r.stdout
    assert int(r.stdout.split()[-1]) <= 4  # bwrap's init, sh, ls, grep: nothing else


def test_missing_workspace_is_a_clear_error(tmp_path: Path) -> None:
    _need_bwrap()
    with pytest.raises(FileNotFoundError, match="workspace"):
        Sandbox(workspace=tmp_path / "nope").argv(["true"])
