"""A runtime or compile worker that loaded libtpu ends quietly on SIGTERM.

libtpu installs absl's failure signal handler when JAX initialises its plugin, and that
handler answers SIGTERM with a stack trace of every thread (issue 27: the trace in the
service's log on every stop). The runtime and the compile worker restore SIGTERM's default
action once JAX is up (``_quiet_signals``). Each case runs a real process that loads
libtpu (``JAX_PLATFORMS`` unset, so JAX initialises every plugin it has), then SIGTERMs
it; the control case, without the restore, shows the trace this guards against.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.datarax.spmd.test_compile_step import _require_libtpu
from tests.helpers import PROJECT_ROOT

LOAD_LIBTPU = "import jax\njax.devices()\n"
CASES = {
    "runtime": "from app.runtime.__main__ import _start_backends\n_start_backends()\n",
    "compile-worker": LOAD_LIBTPU + "from app.compiler.__main__ import _quiet_signals\n"
    "_quiet_signals()\n",
    "control-without-restore": LOAD_LIBTPU,
}
HOLD = "print('up', flush=True)\nimport time\ntime.sleep(120)\n"


@pytest.mark.parametrize("case", list(CASES))
def test_sigterm_after_libtpu_loaded(case):
    _require_libtpu()
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"  # beside other libtpu users of the test host
    proc = subprocess.Popen(
        [sys.executable, "-c", CASES[case] + HOLD],
        cwd=PROJECT_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        line = proc.stdout.readline()  # blocks until the process is up (or died)
        assert line.strip() == "up", proc.stderr.read() if proc.poll() is not None else line
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert "libtpu" in err or "TPU" in err, err[-2000:]  # libtpu really was loaded
    if case == "control-without-restore":
        assert "SIGTERM received" in err, err[-2000:]
    else:
        assert proc.returncode == -signal.SIGTERM, (proc.returncode, err[-2000:])
        assert "SIGTERM received" not in err and "stack trace" not in err, err[-2000:]
