"""A real `mlflow server` for the tracking tests: its own venv, a loopback port, sqlite + files.

Why its own venv: the full `mlflow` package (the server: Flask, SQLAlchemy, alembic, the UI) pins
importlib-metadata<10 (through mlflow-skinny 3.17) while llmft's constraints pin 10.2, and
mlflow 3.18's server wheel needs an mlflow-tracing 3.18 the package mirror does not have. llmft's
own venv holds only the client (`mlflow-skinny`, the `tracking` extra). The server venv is built
once, with pip from the package index, at $LLMFT_MLFLOW_SERVER_VENV (default
~/.cache/llmft/mlflow-server-<version>); `make mlflow-server-venv` builds it ahead of a test run.

The server binds a `ReservedPort` (uvicorn sets SO_REUSEADDR, so it takes the reserved port over)
and is ready when GET /health answers; the port is released then.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from components.runtime.ports import ReservedPort

SERVER_VERSION = "3.17.2"
VENV_ENV = "LLMFT_MLFLOW_SERVER_VENV"
SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
"""No GenAI job runner (seven huey worker processes by default): tracking and the model
registry do not use it, and a 2-core test machine has no cores to spare for it."""
READY_TIMEOUT_S = 240.0  # a loaded 2-core machine: imports and the sqlite migrations, ~40 s


def server_venv() -> Path:
    """The server's venv, built when missing (once: a finished build is moved into place)."""
    venv = Path(
        os.environ.get(VENV_ENV)
        or Path.home() / ".cache" / "llmft" / f"mlflow-server-{SERVER_VERSION}"
    )
    python = venv / "bin" / "python"
    if python.exists():
        return venv
    building = venv.with_name(venv.name + f".building-{os.getpid()}")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(building)], check=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(building / "bin" / "python"), "install",
         "-q", f"mlflow=={SERVER_VERSION}"],
        check=True,
    )  # fmt: skip
    with contextlib.suppress(OSError):  # another session finished first: use theirs
        building.rename(venv)
    return venv


@dataclass
class MlflowServer:
    """A running server: `uri`, its store (`backend`, `artifacts`) and its process."""

    uri: str
    backend: str
    artifacts: Path
    proc: subprocess.Popen[bytes]
    log: Path

    def kill(self) -> None:
        """SIGKILL the server and its workers (its own process group)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def start_server(store: Path) -> MlflowServer:
    """`mlflow server` on a reserved loopback port with the sqlite store and artifact root under
    `store` (a restart on the same `store` serves the same runs)."""
    python = server_venv() / "bin" / "python"
    store.mkdir(parents=True, exist_ok=True)
    backend = f"sqlite:///{store / 'mlflow.db'}"
    artifacts = store / "artifacts"
    port = ReservedPort()
    log = store / f"server-{port.port}.log"
    try:
        proc = subprocess.Popen(
            [str(python), "-m", "mlflow", "server", "--host", "127.0.0.1",
             "--port", str(port.port), "--workers", "1", "--backend-store-uri", backend,
             "--artifacts-destination", str(artifacts)],
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **SERVER_ENV},
        )  # fmt: skip
        server = MlflowServer(f"http://127.0.0.1:{port.port}", backend, artifacts, proc, log)
        _wait_ready(server)
    finally:
        port.release()
    return server


def _wait_ready(server: MlflowServer) -> None:
    """Until GET /health answers (each try waits on the connection), the server exits, or the
    deadline passes."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        try:
            with urllib.request.urlopen(f"{server.uri}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if server.proc.poll() is not None or time.monotonic() > deadline:
            server.kill()
            raise RuntimeError(f"mlflow server did not start:\n{server.log.read_text()[-3000:]}")
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.proc.wait(timeout=0.5)  # returns early if it dies


@contextlib.contextmanager
def running_server(store: Path) -> Iterator[MlflowServer]:
    server = start_server(store)
    try:
        yield server
    finally:
        server.kill()
