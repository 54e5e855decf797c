"""The runtime's entry point (``python -m app.runtime``) started wrong, and its tie to its
parent: a bad command line exits 2 with argparse's reason; bad settings, an ``--fd`` that
is no socket and a missing command module exit 1 with the error's name; a
``--parent-pid`` that is not its parent exits 0 at once, before touching anything; and a
runtime whose parent dies is killed even while its socket is still open elsewhere. Each is
a real process under a timeout. A well-started runtime: ``tests/app/runtime/test_server.py``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from app.runtime.environment import runtime_environment
from tests.app.runtime.test_server import _raw_frame, _raw_reply
from tests.helpers import PROJECT_ROOT, make_settings, pid_alive

EXIT_S = 120.0  # time to start JAX and fail, on a loaded 2-core host


def _settings(tmp_path):
    return make_settings(tmp_path, cpu_devices=2)


def _run(args: list[str], settings, **popen) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app.runtime", *args],
        cwd=PROJECT_ROOT,
        env=runtime_environment(settings, os.environ),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=EXIT_S,
        **popen,
    )


def _settings_arg(settings) -> str:
    return f"--settings-json={settings.model_dump_json(exclude={'api_token'})}"


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


# --------------------------------------------------------------------- command line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "the following arguments are required: --fd"),
        (["--fd", "x"], "argument --fd: invalid int value: 'x'"),
        (["--fd", "3", "--parent-pid", "me"], "argument --parent-pid: invalid int value: 'me'"),
        (["--fd", "3", "--unknown"], "unrecognized arguments: --unknown"),
    ],
)
def test_a_bad_command_line_exits_2_with_argparses_reason(tmp_path, args, message):
    done = _run(args, _settings(tmp_path))
    assert done.returncode == 2, done
    assert _last_line(done.stderr) == f"python -m app.runtime: error: {message}", done.stderr
    assert not (tmp_path / "jax-cache").exists()  # refused before anything started


def test_a_parent_pid_that_is_not_its_parent_exits_0_at_once(tmp_path):
    gone = subprocess.Popen(["true"])
    gone.wait(timeout=30)  # a process that has ended: the parent "died before prctl"
    settings = _settings(tmp_path)
    start = time.monotonic()
    done = _run(["--fd=3", f"--parent-pid={gone.pid}", _settings_arg(settings)], settings)
    assert done.returncode == 0, done
    assert done.stderr == "" and done.stdout == ""
    assert time.monotonic() - start < 30  # no JAX start: it leaves before anything
    assert not (tmp_path / "jax-cache").exists()


# ------------------------------------------------------------------------ settings


def test_settings_that_are_not_json_exit_1_naming_the_error(tmp_path):
    done = _run(["--fd=3", "--settings-json={not json"], _settings(tmp_path))
    assert done.returncode == 1, done
    assert _last_line(done.stderr).startswith("json.decoder.JSONDecodeError: "), done.stderr
    assert not (tmp_path / "jax-cache").exists()


def test_settings_with_a_bad_value_exit_1_naming_the_field(tmp_path):
    done = _run(["--fd=3", '--settings-json={"cpu_devices": "many"}'], _settings(tmp_path))
    assert done.returncode == 1, done
    assert "validation error for Settings" in done.stderr, done.stderr
    assert "cpu_devices" in done.stderr and "valid integer" in done.stderr, done.stderr


# ------------------------------------------------------------- what --fd names


def test_an_fd_that_is_not_open_exits_1_after_the_cache_is_configured(tmp_path):
    settings = _settings(tmp_path)
    done = _run(["--fd=99", _settings_arg(settings)], settings)  # nothing open at 99 there
    assert done.returncode == 1, done
    assert _last_line(done.stderr) == "OSError: [Errno 9] Bad file descriptor", done.stderr
    # Start-up order: the persistent cache is set up before the channel is opened.
    assert (tmp_path / "jax-cache").is_dir()


def test_an_fd_that_is_not_a_socket_exits_1(tmp_path):
    settings = _settings(tmp_path)
    with open(tmp_path / "plain.txt", "w") as plain:
        fd = plain.fileno()
        done = _run([f"--fd={fd}", _settings_arg(settings)], settings, pass_fds=[fd])
    assert done.returncode == 1, done
    assert "Socket operation on non-socket" in _last_line(done.stderr), done.stderr


def test_a_command_module_that_cannot_be_imported_exits_1(tmp_path):
    settings = _settings(tmp_path)
    args = ["--fd=99", _settings_arg(settings), "--command-module", "tests.no_such_commands"]
    done = _run(args, settings)
    assert done.returncode == 1, done
    assert _last_line(done.stderr) == (
        "ModuleNotFoundError: No module named 'tests.no_such_commands'"
    ), done.stderr


# ------------------------------------------------------------------ parent's death

# A parent that starts the runtime on a socket it was handed, prints the runtime's pid and
# dies (os._exit) when told to; the test keeps the socket's other end open all along.
_PARENT = """
import os, subprocess, sys
fd = int(sys.argv[1])
runtime = subprocess.Popen(
    [sys.executable, "-m", "app.runtime", f"--fd={fd}", f"--parent-pid={os.getpid()}",
     *sys.argv[2:]],
    pass_fds=[fd],
)
print(runtime.pid, flush=True)
sys.stdin.readline()
os._exit(0)
"""


def test_the_runtime_dies_with_its_parent_even_with_its_socket_open(tmp_path):
    settings = _settings(tmp_path)
    ours, theirs = socket.socketpair()
    ours.settimeout(EXIT_S)
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, str(theirs.fileno()), _settings_arg(settings)],
        cwd=PROJECT_ROOT,
        env=runtime_environment(settings, os.environ),
        pass_fds=[theirs.fileno()],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    theirs.close()
    runtime_pid = None
    try:
        runtime_pid = int(parent.stdout.readline())
        ours.sendall(_raw_frame({"id": 1, "command": "ping"}))
        reply = _raw_reply(ours)  # it is up, serving, and its death signal is armed
        assert reply["ok"] and reply["result"]["pid"] == runtime_pid, reply
        parent.stdin.write("die\n")
        parent.stdin.flush()
        assert parent.wait(timeout=30) == 0
        deadline = time.monotonic() + 30
        while pid_alive(runtime_pid):
            assert time.monotonic() < deadline, "the runtime outlived its parent"
            time.sleep(0.05)
        assert ours.recv(1) == b""  # its end closed by its death, not by ours
    finally:
        ours.close()
        if parent.poll() is None:
            parent.kill()
            parent.wait(timeout=30)
        if runtime_pid is not None and pid_alive(runtime_pid):
            os.kill(runtime_pid, signal.SIGKILL)
