"""Real processes for fault tests: a PostgreSQL database of our own that ``manage.py``
subprocesses use, and our own redis-server / nats-server instances that a test may kill."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PG = os.environ.get("DLO_TEST_PG_ADMIN_URL", "postgres://postgres@127.0.0.1:5432/postgres")
NATS_SERVER = os.environ.get("DLO_NATS_SERVER_BIN", "/usr/sbin/nats-server")
REDIS_SERVER = os.environ.get("DLO_REDIS_SERVER_BIN", shutil.which("redis-server") or "")


def pg(dbname: str = "postgres") -> Any:
    import psycopg

    return psycopg.connect(PG.rsplit("/", 1)[0] + "/" + dbname, autocommit=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(check: Any, timeout: float, what: str, every: float = 0.1) -> Any:
    """Poll ``check`` until it returns something truthy (bounded); fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)


class ProcDb:
    """A migrated PostgreSQL database for ``manage.py`` subprocesses."""

    def __init__(self) -> None:
        self.name = f"dlo_hingest_{uuid.uuid4().hex[:8]}"
        with pg() as conn:
            conn.execute(f'CREATE DATABASE "{self.name}"')
        self.env = {
            **os.environ,
            "DATABASE_URL": PG.rsplit("/", 1)[0] + "/" + self.name,
            "DATABASE_CONN_MAX_AGE": "0",
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "PYTHONUNBUFFERED": "1",
        }
        self.env.pop("DLO_TEST_CRASH_AFTER_COMMIT", None)
        self.manage = [sys.executable, str(ROOT / "manage.py")]
        subprocess.run([*self.manage, "migrate", "-v0"], env=self.env, cwd=ROOT, check=True)

    def shell(self, code: str) -> str:
        done = subprocess.run(
            [*self.manage, "shell", "-c", code],
            env=self.env,
            cwd=ROOT,
            capture_output=True,
            check=True,
            timeout=120,
        )
        return done.stdout.decode()

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with pg(self.name) as conn:
            return list(conn.execute(sql, params).fetchall())

    def execute(self, sql: str, *params: Any) -> None:
        with pg(self.name) as conn:
            conn.execute(sql, params)

    def only_new_channels(self) -> None:
        """Tests share the module's database: disable what earlier tests declared."""
        self.execute("UPDATE channels_registry_broker SET enabled = false")
        self.execute("UPDATE channels_registry_channel SET enabled = false")

    def spawn(self, *args: str, log: Path | None = None, **env: str) -> subprocess.Popen[bytes]:
        """Start ``manage.py *args``; its output goes to ``log`` (readable while it runs)
        or to a pipe (read with ``output``)."""
        sink: Any = subprocess.PIPE if log is None else log.open("wb")
        try:
            return subprocess.Popen(
                [*self.manage, *args],
                env={**self.env, **env},
                cwd=ROOT,
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        finally:
            if log is not None:
                sink.close()

    def cut(self) -> None:
        """The database goes away: no new connections, every current one terminated."""
        with pg() as conn:
            conn.execute(f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS false')
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                [self.name],
            )

    def restore(self) -> None:
        with pg() as conn:
            conn.execute(f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS true')

    def drop(self) -> None:
        with pg() as conn:
            conn.execute(f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS true')
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def proc_db_module() -> Iterator[ProcDb]:
    from tests.conftest import broker_required

    try:
        pg().close()
    except Exception as exc:  # noqa: BLE001 - any connection failure means "not reachable"
        broker_required("PostgreSQL", exc)
    db = ProcDb()
    try:
        yield db
    finally:
        db.drop()


@pytest.fixture
def proc_db(proc_db_module: ProcDb) -> Iterator[ProcDb]:
    """The module's database, open again after each test (a failed test may leave it cut)."""
    yield proc_db_module
    proc_db_module.restore()


class OwnServer:
    """A broker process of our own on a free port, which a test may kill and restart."""

    def __init__(self, argv: list[str], port: int, workdir: Path) -> None:
        self.argv, self.port, self.workdir = argv, port, workdir
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        log = (self.workdir / "server.log").open("ab")
        self.process = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        wait_until(self._accepts, 15, f"{self.argv[0]} on port {self.port}", every=0.05)

    def _accepts(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"{self.argv[0]} exited with {self.process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
        except OSError:
            return False
        return True

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


def _binary(path: str, name: str) -> None:
    if not (path and os.path.isfile(path) and os.access(path, os.X_OK)):
        message = f"{name} binary not found"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


def own_redis(workdir: Path) -> OwnServer:
    """redis-server with an fsync-always AOF, so a kill -9 and restart keeps the streams."""
    _binary(REDIS_SERVER, "redis-server")
    port = free_port()
    argv = [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    argv += ["--appendonly", "yes", "--appendfsync", "always", "--dir", str(workdir)]
    return OwnServer(argv, port, workdir)


def own_nats(workdir: Path) -> OwnServer:
    _binary(NATS_SERVER, "nats-server")
    port = free_port()
    argv = [NATS_SERVER, "-js", "-sd", str(workdir), "-a", "127.0.0.1", "-p", str(port)]
    return OwnServer(argv, port, workdir)


def output(proc: subprocess.Popen[bytes], timeout: float = 30) -> str:
    out, _ = proc.communicate(timeout=timeout)
    return out.decode("utf-8", "replace")
