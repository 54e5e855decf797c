"""A real, throw-away PostgreSQL server for the tests of the shared store.

The shared store (DATARAX_DATABASE_URL) is tested against a real PostgreSQL, not a mock:
its transactions, locks and durability are what is under test. ``PostgresServer``
initialises a fresh cluster in a temporary folder, runs ``postgres`` on a free port of
127.0.0.1 (with ``fsync=on``: the service promises durability, and a crash test must see
what a real crash leaves), hands out one empty database per test, and can be stopped,
killed (SIGKILL, a crash) and restarted on the same data and port.

``initdb`` refuses to run as root, and the tests run as root here and in CI: as root the
server runs as Debian's ``postgres`` system user (the ``postgresql`` package creates it),
owning the data and socket folders; otherwise it runs as the current user.

No server outlives the test session: ``close()`` stops it and removes its folder; every
open server is closed at interpreter exit (atexit) as a last resort; and where the Python
thread that started it dies without that (a crashed or SIGKILLed pytest worker), the
kernel sends the postmaster SIGQUIT (``PR_SET_PDEATHSIG``), its immediate shutdown.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import glob
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
import uuid
import warnings
from pathlib import Path
from types import TracebackType
from typing import Any

import psycopg
from psycopg import sql

PACKAGE_HINT = "apt-get install -y postgresql"
SERVER_USER = "datarax"
SYSTEM_USER = "postgres"  # the system user Debian's postgresql package creates
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0
ORPHAN_TIMEOUT_S = 10.0
START_ATTEMPTS = 5  # a free port another process took first: try another
LOG_TAIL_CHARS = 4000
_PR_SET_PDEATHSIG = 1
_IN_USE = ("already in use", "could not bind", "pre-existing shared memory block")


class PostgresUnavailable(RuntimeError):
    """The PostgreSQL binaries are not installed (the fixtures skip, or fail under CI)."""


def find_bin_dir() -> Path:
    """The folder of ``initdb``, ``postgres`` and ``pg_ctl``: where PATH finds ``initdb``
    (symlinks resolved, so all three come from one installation), else the newest
    ``/usr/lib/postgresql/<major>/bin`` (Debian's package puts them there, off PATH)."""
    found = shutil.which("initdb")
    candidates = [Path(os.path.realpath(found)).parent] if found else []
    debian = glob.glob("/usr/lib/postgresql/*/bin")
    candidates += sorted(
        (Path(p) for p in debian if Path(p).parent.name.isdigit()),
        key=lambda p: int(p.parent.name),
        reverse=True,
    )
    for folder in candidates:
        if all(os.access(folder / name, os.X_OK) for name in ("initdb", "postgres")):
            return folder
    raise PostgresUnavailable(f"PostgreSQL not installed: {PACKAGE_HINT}")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _run_as() -> pwd.struct_passwd | None:
    """The system user to run the server as: ``postgres`` when we are root (``initdb``
    refuses root), None (ourselves) otherwise."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        raise RuntimeError(
            f"running as root, and initdb refuses root, but there is no {SYSTEM_USER!r} "
            f"system user to run PostgreSQL as (Debian's package creates it: {PACKAGE_HINT}; "
            f"or: useradd --system {SYSTEM_USER})"
        ) from None


def _reachable_temp_root(user: pwd.struct_passwd | None) -> str:
    """A folder for the server's temporary folder that ``user`` can traverse: the usual
    temporary folder, unless one of its parents shuts others out (TMPDIR under /root)."""
    root = tempfile.gettempdir()
    if user is None:
        return root
    path = Path(root).resolve()
    for folder in (path, *path.parents):
        info = folder.stat()
        if info.st_uid != user.pw_uid and not info.st_mode & stat.S_IXOTH:
            return "/tmp"
    return root


_PRCTL = ctypes.CDLL(None, use_errno=True).prctl  # resolved here: the child only calls it


def _die_with_parent() -> None:
    """In the server's child process, before exec: SIGQUIT (PostgreSQL's immediate
    shutdown) when the thread that started it dies, so a SIGKILLed pytest worker leaves
    no server behind. Set after the switch of user, which would clear it."""
    _PRCTL(_PR_SET_PDEATHSIG, signal.SIGQUIT, 0, 0, 0)


def _children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (Linux's /proc)."""
    kids: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            kids.append(int(entry))
    return kids


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class PostgresServer:
    """One PostgreSQL cluster in a temporary folder, served on 127.0.0.1:``port``.

    ``start()`` initialises it (the first time) and waits until it accepts connections;
    ``url(dbname)``; ``create_database()``: a fresh empty database per call; ``stop()``
    (fast shutdown), ``kill()`` (SIGKILL: a crash), ``restart()`` (same data and port; after
    a kill, PostgreSQL recovers from its WAL); ``close()`` stops it and removes the folder.
    A context manager: ``with PostgresServer() as server: ...`` starts and closes it.
    """

    _open: set[PostgresServer] = set()  # closed at exit, if still open

    def __init__(self, bin_dir: Path | None = None) -> None:
        self.bin_dir = bin_dir if bin_dir is not None else find_bin_dir()
        self._user = _run_as()
        self.base: Path | None = None  # the temporary folder: data, socket, log
        self.port: int | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self._databases = 0
        self._log_start = 0  # where the log of the latest launch begins
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ folders
    @property
    def data_dir(self) -> Path:
        return self._base() / "data"

    @property
    def socket_dir(self) -> Path:
        return self._base() / "socket"

    @property
    def log_path(self) -> Path:
        return self._base() / "postgres.log"

    def _base(self) -> Path:
        if self.base is None:
            raise RuntimeError("the server has not been started (or has been closed)")
        return self.base

    def _make_folders(self) -> None:
        """The temporary folder with the socket folder, both owned by the server's user
        (initdb creates the data folder in it, as that user, with the modes it wants)."""
        self.base = Path(
            tempfile.mkdtemp(prefix="datarax-pg-", dir=_reachable_temp_root(self._user))
        )
        self.socket_dir.mkdir(mode=0o700)
        self.log_path.touch(mode=0o600)
        if self._user is not None:
            for path in (self.base, self.socket_dir):
                os.chown(path, self._user.pw_uid, self._user.pw_gid)

    # ------------------------------------------------------------------ processes
    def _as_user(self) -> dict[str, Any]:
        """``subprocess`` arguments that run a command as the server's user, with that
        user's groups only, and its home folder (root's may be closed to it)."""
        if self._user is None:
            return {"cwd": self.base}
        env = dict(os.environ, HOME=self._user.pw_dir, USER=self._user.pw_name)
        env["LOGNAME"] = self._user.pw_name
        return {
            "user": self._user.pw_uid,
            "group": self._user.pw_gid,
            "extra_groups": [],
            "cwd": self.base,
            "env": env,
        }

    def _initdb(self) -> None:
        command = [
            str(self.bin_dir / "initdb"),
            "-D", str(self.data_dir),
            "-U", SERVER_USER,
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-instructions",
        ]  # fmt: skip
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=120, **self._as_user()
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"initdb failed (exit {done.returncode}):\n{done.stdout}\n{done.stderr}"
            )

    def _launch(self) -> None:
        """Starts ``postgres`` on ``self.port``, its output appended to the log."""
        assert self.port is not None
        command = [
            str(self.bin_dir / "postgres"),
            "-D", str(self.data_dir),
            "-p", str(self.port),
            "-k", str(self.socket_dir),
            "-c", "listen_addresses=127.0.0.1",
            "-c", "fsync=on",
            "-c", "max_connections=200",
            "-c", "shared_buffers=32MB",
        ]  # fmt: skip
        started_here = threading.current_thread() is threading.main_thread()
        with open(self.log_path, "ab") as log, warnings.catch_warnings():
            # JAX, once started in this test process, warns on every fork (a preexec_fn
            # forks): the child only calls prctl and execs postgres.
            warnings.filterwarnings("ignore", r"os\.fork\(\) was called", RuntimeWarning)
            warnings.filterwarnings("ignore", r".*multi-threaded.*fork", DeprecationWarning)
            self._log_start = log.tell()
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C in the terminal reaches pytest, not it
                # Only the main thread lives as long as the process: a pytest worker.
                preexec_fn=_die_with_parent if started_here else None,
                **self._as_user(),
            )

    def _wait_ready(self, deadline: float) -> str | None:
        """Waits until the server accepts a connection: None when it does, the log
        of this launch when the server exits first. Raises when it does neither by
        ``deadline``."""
        assert self.process is not None
        while True:
            if self.process.poll() is not None:
                with open(self.log_path, "rb") as log:
                    log.seek(self._log_start)
                    return log.read().decode(errors="replace") or "(no output)"
            try:
                with psycopg.connect(self.url("postgres"), connect_timeout=2):
                    return None
            except psycopg.OperationalError as error:
                last = error
            if time.monotonic() > deadline:
                self._signal_and_wait(signal.SIGKILL)
                raise RuntimeError(
                    f"PostgreSQL did not accept connections within {READY_TIMEOUT_S:.0f} s "
                    f"({last}); its log:\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def _serve(self, *, keep_port: bool) -> None:
        """Launches the server and waits until it is ready. A port that another process
        bound first is replaced by a fresh one unless ``keep_port``; shared memory still
        held by the backends of a killed server is waited for."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        new_ports = 0
        while True:
            self._launch()
            failure = self._wait_ready(deadline)
            if failure is None:
                return
            if not any(marker in failure for marker in _IN_USE) or time.monotonic() > deadline:
                break
            if not keep_port and "shared memory" not in failure:
                new_ports += 1
                if new_ports >= START_ATTEMPTS:
                    break
                self.port = _free_port()
            time.sleep(0.1)
        raise RuntimeError(
            f"PostgreSQL exited while starting (port {self.port}); its log:\n{self.log_tail()}"
        )

    def _signal_and_wait(self, signum: int, timeout: float = STOP_TIMEOUT_S) -> None:
        """Sends ``signum`` to the postmaster and waits for it; SIGKILL past ``timeout``."""
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signum)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout)
        self.process = None

    # ------------------------------------------------------------------ public API
    def start(self) -> PostgresServer:
        """Initialises a fresh cluster (the first time) and starts the server; returns
        once it accepts connections. Starting a running server does nothing."""
        with self._lock:
            if self.running:
                return self
            if self.base is None:
                self._make_folders()
                PostgresServer._open.add(self)
                self._initdb()
            fresh = self.port is None
            if fresh:
                self.port = _free_port()
            self._serve(keep_port=not fresh)
            return self

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def url(self, dbname: str = "postgres") -> str:
        """``postgresql://datarax@127.0.0.1:<port>/<dbname>`` (trust authentication)."""
        if self.port is None:
            raise RuntimeError("the server has not been started")
        return f"postgresql://{SERVER_USER}@127.0.0.1:{self.port}/{dbname}"

    def create_database(self, name: str | None = None) -> str:
        """Creates an empty database (``name``, else a unique one) and returns its URL."""
        if name is None:
            with self._lock:
                self._databases += 1
                name = f"test_{os.getpid()}_{self._databases}_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url(name)

    def drop_database(self, name: str) -> None:
        """Drops database ``name``, closing the connections still open to it."""
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            query = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
            conn.execute(query.format(sql.Identifier(name)))

    def stop(self) -> None:
        """Fast shutdown (SIGINT): open transactions are rolled back, the data kept."""
        with self._lock:
            self._signal_and_wait(signal.SIGINT)

    def kill(self) -> None:
        """A crash: SIGKILL to the postmaster, no checkpoint, no clean shutdown. Its
        backends notice and exit by themselves; they are waited for (and SIGKILLed past
        a bound), so that a ``restart()`` finds their shared memory released."""
        with self._lock:
            process = self.process
            if process is None:
                return
            orphans = _children(process.pid)
            self._signal_and_wait(signal.SIGKILL)
            deadline = time.monotonic() + ORPHAN_TIMEOUT_S
            while (alive := [pid for pid in orphans if _alive(pid)]) and (
                time.monotonic() < deadline
            ):
                time.sleep(0.02)
            for pid in alive:
                with contextlib.suppress(ProcessLookupError):  # exited meanwhile
                    os.kill(pid, signal.SIGKILL)

    def restart(self) -> PostgresServer:
        """Stops the server (fast) if it runs and starts it again on the same data folder
        and port; after ``kill()``, PostgreSQL first recovers from its WAL."""
        self.stop()
        return self.start()

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        """The end of the server's log (its stdout and stderr, all its starts)."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except (OSError, RuntimeError):
            return "(no log)"

    def close(self) -> None:
        """Stops the server and removes its folder. Closing twice does nothing."""
        self.stop()
        with self._lock:
            if self.base is not None:
                shutil.rmtree(self.base, ignore_errors=True)
                self.base = None
                self.port = None
            PostgresServer._open.discard(self)

    def __enter__(self) -> PostgresServer:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<PostgresServer {state} port={self.port} base={self.base}>"


@atexit.register
def _close_all() -> None:
    """The last resort: no server outlives the Python process that started it."""
    for server in list(PostgresServer._open):
        server.close()
