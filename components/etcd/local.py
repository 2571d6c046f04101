"""A per-run etcd as a local process: start it on reserved loopback ports, stop it by run id.

The KFP task that starts etcd is not the one that stops it (cleanup runs in an exit handler, or
in `llmft cleanup` from a shell), so everything needed to stop it is written to a state file,
`$LLMFT_STATE_DIR/<safe run id>/etcd.json` (default root: `<tmp>/llmft-runs`, shared with the
local launcher, read at call time). Example:

    endpoint = start("run-1", detached=True)   # "127.0.0.1:PORT", healthy
    ...                                         # torchrun --rdzv-endpoint $endpoint ...
    stop("run-1")                               # from any process: kills etcd, removes its data

etcd listens on 127.0.0.1 only, keeps its data in a fresh temp dir, and runs in its own session
when `detached` so that the task which started it can exit (and be signalled) independently.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import requests

from components.runtime import lifeline
from components.runtime.ports import LOOPBACK, ReservedPort
from components.runtime.run_identity import run_state_dir, safe_run_id

logger = logging.getLogger(__name__)

STATE_FILE = "etcd.json"
INSTALL_HINT = (
    "install it (Debian/Ubuntu: `apt-get install etcd-server`; elsewhere an etcd release from "
    "https://github.com/etcd-io/etcd/releases), or use `--rdzv-backend c10d`, which needs no etcd"
)


class EtcdNotFoundError(ValueError):
    """No etcd binary on this machine (a setup problem the user fixes)."""


@dataclass(frozen=True)
class LocalEtcd:
    """What `start` recorded about a run's etcd (the content of its state file)."""

    run_id: str
    endpoint: str
    """`127.0.0.1:PORT`, the client endpoint for torchrun's --rdzv-endpoint."""
    pid: int
    data_dir: str
    log_file: str
    enable_v2: bool
    detached: bool


def state_file(run_id: str, root: str | Path | None = None) -> Path:
    return run_state_dir(run_id, root) / STATE_FILE


def find_etcd(binary: str | None = None) -> str:
    """Path of the etcd binary (`binary` if given, else `etcd` on PATH).

    Raises:
        EtcdNotFoundError: with how to install it.
    """
    found = shutil.which(binary or "etcd")
    if found is None:
        what = f"etcd binary {binary!r} not found" if binary else "no `etcd` binary on PATH"
        raise EtcdNotFoundError(f"{what}: {INSTALL_HINT}")
    return found


_alive = lifeline.alive  # the one liveness check, by the name this module always used


def _is_our_etcd(pid: int, data_dir: str) -> bool:
    """Guard against pid reuse: the process must be etcd running on this run's data dir."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return _alive(pid)
    return f"--data-dir={data_dir}".encode() in cmdline


def _healthy(endpoint: str) -> bool:
    try:
        response = requests.get(f"http://{endpoint}/health", timeout=1.0)
        return response.ok and str(response.json().get("health")).lower() == "true"
    except (requests.RequestException, ValueError):
        return False


def _tail(path: str, lines: int = 15) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def start(
    run_id: str,
    *,
    enable_v2: bool = False,
    detached: bool = False,
    root: str | Path | None = None,
    binary: str | None = None,
    timeout_s: float = 30.0,
    die_with_parent: bool = False,
) -> str:
    """Start this run's etcd on loopback and wait until it is healthy.

    Idempotent: if the run's etcd already runs and is healthy (a retried task), its endpoint is
    returned and nothing new starts.

    Args:
        run_id: the pipeline run id; names the state dir.
        enable_v2: also serve etcd's v2 API (needed by torch's built-in `etcd-v2` backend only).
        detached: run etcd in its own session so it outlives the calling task and its signals.
        root: state root (default: $LLMFT_STATE_DIR or `<tmp>/llmft-runs`).
        binary: etcd executable (default: `etcd` on PATH).
        timeout_s: how long to wait for /health before giving up.
        die_with_parent: etcd gets SIGTERM when the calling process dies (the local launcher's
            own etcd; not the pipeline's etcd step, whose etcd outlives the step).

    Returns:
        The client endpoint, `127.0.0.1:PORT`.

    Raises:
        EtcdNotFoundError: no etcd binary.
        RuntimeError: etcd exited or did not become healthy in time (with its log's tail).
    """
    existing = status(run_id, root=root)
    if existing is not None:
        if existing.enable_v2 == enable_v2 and _healthy(existing.endpoint):
            logger.info("etcd of run %s already runs at %s", run_id, existing.endpoint)
            return existing.endpoint
        stop(run_id, root=root)  # unhealthy, or started with the other v2 setting
    executable = find_etcd(binary)
    path = state_file(run_id, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Both ports stay reserved until etcd listens on them (see components/runtime/ports.py).
    with ReservedPort() as client_port, ReservedPort() as peer_port:
        log_file = str(path.parent / "etcd.log")
        proc, info = _spawn(
            executable, run_id, client_port, peer_port, log_file, enable_v2, detached,
            die_with_parent,
        )  # fmt: skip
        # Written before the health wait so that a cleanup racing with us can still stop it.
        path.write_text(json.dumps(asdict(info), indent=2))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and proc.poll() is None:
            if _healthy(info.endpoint):
                logger.info(
                    "started etcd for run %s at %s (pid %d, v2 API %s, data %s)",
                    run_id,
                    info.endpoint,
                    proc.pid,
                    "on" if enable_v2 else "off",
                    info.data_dir,
                )
                return info.endpoint
            time.sleep(0.1)  # polling /health, not waiting for time to pass
    log_tail = _tail(info.log_file)
    stop(run_id, root=root)
    state = "exited" if proc.poll() is not None else f"was not healthy after {timeout_s:.0f} s"
    raise RuntimeError(f"etcd for run {run_id} {state}; last log lines:\n{log_tail}")


def _spawn(
    executable: str,
    run_id: str,
    client_port: int,
    peer_port: int,
    log_file: str,
    enable_v2: bool,
    detached: bool,
    die_with_parent: bool = False,
) -> tuple[subprocess.Popen[bytes], LocalEtcd]:
    """Start a single-member etcd on the given loopback ports, in a fresh temp data dir."""
    name = f"llmft-{safe_run_id(run_id)}"[:63]
    data_dir = tempfile.mkdtemp(prefix=f"{name}-", suffix=".etcd")
    client_url, peer_url = f"http://{LOOPBACK}:{client_port}", f"http://{LOOPBACK}:{peer_port}"
    cmd = [
        executable,
        f"--name={name}",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client_url}",
        f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster={name}={peer_url}",
        f"--initial-cluster-token={name}",
        "--initial-cluster-state=new",
    ]
    if enable_v2:
        cmd.append("--enable-v2=true")
    # ETCD_* variables from the caller's environment would silently reconfigure etcd.
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD_")}
    with open(log_file, "ab") as log:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=detached,
            preexec_fn=lifeline.die_with_parent() if die_with_parent else None,
        )
    info = LocalEtcd(
        run_id=run_id,
        endpoint=f"{LOOPBACK}:{client_port}",
        pid=proc.pid,
        data_dir=data_dir,
        log_file=log_file,
        enable_v2=enable_v2,
        detached=detached,
    )
    return proc, info


def status(run_id: str, *, root: str | Path | None = None) -> LocalEtcd | None:
    """The run's recorded etcd if its process still runs, else None."""
    path = state_file(run_id, root)
    try:
        info = LocalEtcd(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None
    return info if _alive(info.pid) and _is_our_etcd(info.pid, info.data_dir) else None


def stop(run_id: str, *, root: str | Path | None = None, grace_s: float = 10.0) -> bool:
    """Stop the run's etcd (SIGTERM, then SIGKILL after `grace_s`) and delete its data.

    Works from any process: everything needed is in the run's state file. Safe to call when
    nothing was started (returns False).

    Returns:
        True when there was a recorded etcd to stop or clean up.
    """
    path = state_file(run_id, root)
    try:
        info = LocalEtcd(**json.loads(path.read_text()))
    except FileNotFoundError:
        return False
    except (OSError, ValueError, TypeError) as exc:
        logger.warning("unreadable etcd state %s (%s); removing it", path, exc)
        path.unlink(missing_ok=True)
        return True
    if _alive(info.pid) and _is_our_etcd(info.pid, info.data_dir):
        _terminate(info.pid, grace_s)
    shutil.rmtree(info.data_dir, ignore_errors=True)
    path.unlink(missing_ok=True)
    Path(info.log_file).unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # other state (the launcher's) may share the dir
        path.parent.rmdir()
    logger.info("stopped etcd of run %s (pid %d) and removed %s", run_id, info.pid, info.data_dir)
    return True


def _terminate(pid: int, grace_s: float) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        _reap(pid)
        if not _alive(pid):
            return
        time.sleep(0.05)
    logger.warning("etcd (pid %d) ignored SIGTERM for %.0f s; killing it", pid, grace_s)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    while _alive(pid):
        _reap(pid)
        time.sleep(0.05)


def _reap(pid: int) -> None:
    """Collect the exit status if etcd is our child, so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
