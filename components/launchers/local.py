"""Local backend: N torchrun agents as separate local processes ("nodes"), P workers each.

This is the same multi-node launch as on a cluster, only on one machine: each agent is its own
`python -m torch.distributed.run` process (started through `components.launchers.torchrun_agent`,
which never hangs at exit) that finds the others through the rendezvous (etcd-v3 by default, through a per-run local etcd started here when no endpoint is given; etcd-v2 and c10d
selectable). So a local run exercises rendezvous, restarts and failure handling for real.

How processes are tracked, and why:
- each agent starts in its own session (process group), so signals reach it and not us;
- torchrun starts its workers in sessions of their own, so a group kill misses them if an agent
  dies hard; every process of a run therefore carries `LLMFT_LAUNCHER_RUN=<state dir>` in its
  environment, and the last resort is to SIGKILL whatever in /proc carries it;
- a state file per run id (`<state root>/<run>/launcher.json`) lets `cleanup(run_id)` from another
  process (the pipeline's exit handler, `llmft cleanup`) find and stop the run;
- the agents and the run's own etcd get SIGTERM when this launcher dies, even by SIGKILL
  (`lifeline.die_with_parent`); an agent then stops its workers. What such a run leaves (its
  state, the etcd's data dir) `llmft cleanup` removes: the state records the launcher's pid, so
  `llmft cleanup` without a run id knows which runs are dead.

Run by hand: `llmft train --backend local --nodes 2 --nproc-per-node 2 --model M --data D --output O`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, ClassVar

from components.launchers.base import (
    CANCELLED,
    FAILED,
    SUCCEEDED,
    TORCHRUN_ENV,
    Launcher,
    LaunchResult,
    LogSink,
    TrainLaunch,
)
from components.launchers.run_processes import MARKER_ENV, marked_pids, terminate_run_processes
from components.runtime.lifeline import die_with_parent
from components.runtime.ports import ReservedPort
from components.runtime.run_identity import run_state_dir
from trainer import storage

STATE_FILE = "launcher.json"


@dataclass
class _Node:
    index: int
    proc: subprocess.Popen[str]
    log_path: Path
    tail: deque[str]
    agent_tail: deque[str] = field(default_factory=lambda: deque(maxlen=80))
    reader: threading.Thread | None = None
    log_file: IO[str] | None = None


@dataclass
class _RunState:
    run_id: str
    pgids: list[int] = field(default_factory=list)
    etcd_started: bool = False
    state_dir: str = ""
    log_dir: str = ""
    launcher_pid: int = 0
    """The process following the run: when it is gone, the run is dead (`llmft cleanup`)."""

    def write(self) -> None:
        path = Path(self.state_dir) / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.__dict__, indent=2))
        tmp.replace(path)


@dataclass(frozen=True)
class LocalOptions:
    """How the local backend runs its torchrun agents (`LocalLauncher`)."""

    backend: ClassVar[str] = "local"

    log_dir: str | os.PathLike[str] | None = None
    """Where each node's log goes (`node<i>.log`) and torchrun's per-rank files; default
    `<output>/logs` (`<state dir>/logs` when the output is remote, e.g. gs://)."""
    state_root: str | os.PathLike[str] | None = None
    """Parent of the per-run state directory; default `run_identity.state_root()`."""
    python: str = sys.executable
    """Interpreter for the agents (default: this one, so the same venv)."""
    grace_s: float = 15.0
    """How long stopped agents get to stop their workers before SIGKILL."""
    tail_lines: int = 30
    """How many of the failing node's last lines a failure reports."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment for every agent and worker."""
    poll_s: float = 0.2
    """How often the wait loop checks the agents."""

    def launcher(self, *, log: LogSink | None = None) -> LocalLauncher:
        """The launcher of these options' backend (`LocalLauncher`)."""
        return LocalLauncher(self, log=log)


class LocalLauncher(Launcher):
    """N local torchrun agents (one per "node"), P workers each; `options` say how
    (`LocalOptions`), `log` is the sink for the prefixed log lines (default: stdout)."""

    backend = "local"

    def __init__(self, options: LocalOptions | None = None, *, log: LogSink | None = None) -> None:
        super().__init__(log=log)
        options = options or LocalOptions()
        self._log_dir = Path(options.log_dir) if options.log_dir else None
        self._state_root = Path(options.state_root) if options.state_root else None
        self.python = options.python
        self.grace_s = options.grace_s
        self.tail_lines = options.tail_lines
        self.env = dict(options.env)
        self.poll_s = options.poll_s
        self._nodes: list[_Node] = []
        self._state: _RunState | None = None
        self._started_at = 0.0
        self._finished = False
        self._store_port: ReservedPort | None = None
        self._lock = threading.Lock()

    # ---- paths and state ----------------------------------------------------------------------

    def state_dir(self, run_id: str) -> Path:
        return run_state_dir(run_id, self._state_root)

    def marker(self, run_id: str) -> str:
        """The value of MARKER_ENV in every process of the run (run_processes: its state dir)."""
        return str(self.state_dir(run_id))

    def _read_state(self, run_id: str) -> _RunState | None:
        path = self.state_dir(run_id) / STATE_FILE
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return _RunState(**data)

    # ---- start --------------------------------------------------------------------------------

    def start(self, launch: TrainLaunch) -> None:
        launch.validate()
        if self._nodes:
            raise RuntimeError("this launcher already started a run; use a new LocalLauncher")
        self.launch = launch
        state_dir = self.state_dir(launch.run_id)
        if (state_dir / STATE_FILE).exists() and marked_pids(self.marker(launch.run_id)):
            raise ValueError(
                f"run {launch.run_id!r} is already running locally: pick another run id or stop "
                "it with the cleanup step (components/steps/cleanup.py)"
            )
        state_dir.mkdir(parents=True, exist_ok=True)
        # Agents write their logs with plain file I/O: a gs:// run keeps them in its local state.
        default_logs = state_dir if storage.is_remote(launch.output) else Path(launch.output)
        log_dir = self._log_dir or default_logs / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        self._state = _RunState(
            run_id=launch.run_id,
            state_dir=str(state_dir),
            log_dir=str(log_dir),
            launcher_pid=os.getpid(),
        )
        self._state.write()
        self._started_at = time.monotonic()

        try:
            endpoint = launch.rdzv_endpoint or self._start_rendezvous(launch)
            self.log(
                f"[launcher] run {launch.run_id}: {launch.nodes} node(s) x "
                f"{launch.nproc_per_node} process(es), rendezvous {launch.rdzv_backend} at "
                f"{endpoint}, logs in {log_dir}"
            )
            for index in range(launch.nodes):
                self._nodes.append(self._start_node(launch, index, endpoint, log_dir))
                self._state.pgids.append(self._nodes[-1].proc.pid)
                self._state.write()
        except BaseException:
            # Whatever failed (no etcd binary, a signal), leave nothing behind.
            self._stop_all()
            self._finish()
            raise

    def _start_rendezvous(self, launch: TrainLaunch) -> str:
        assert self._state is not None
        if launch.rdzv_backend == "c10d":
            # The agent whose hostname matches the endpoint hosts the c10d store; on loopback the
            # first agent to bind wins and the others connect (torch retries as a client). The
            # port stays reserved for the run (see components/runtime/ports.py), released in _finish.
            self._store_port = ReservedPort()
            return self._store_port.endpoint
        # etcd's client imports requests (~200 modules): only for an etcd rendezvous
        from components.etcd import local as etcd_local

        # Detached: a terminal's Ctrl-C reaches the whole foreground group; etcd must outlive the
        # agents' shutdown, and we stop it ourselves right after.
        endpoint = etcd_local.start(
            launch.run_id,
            enable_v2=launch.rdzv_backend == "etcd-v2",
            detached=True,
            root=self._state_root,
            die_with_parent=True,
        )
        self._state.etcd_started = True
        self._state.write()
        self.log(f"[launcher] started a local etcd for this run at {endpoint}")
        return endpoint

    def _start_node(self, launch: TrainLaunch, index: int, endpoint: str, log_dir: Path) -> _Node:
        env = {
            **os.environ,
            **TORCHRUN_ENV,
            **self.env,
            MARKER_ENV: self.marker(launch.run_id),
            # torchrun prefixes each worker line with this (it fills in the global rank).
            "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": f"[node{index} rank${{rank}}] ",
        }
        env.setdefault("OMP_NUM_THREADS", "1")
        # --tee needs a log dir, or torchrun makes a temp dir of its own and leaves it behind.
        cmd = [
            self.python,
            "-m",
            "components.launchers.torchrun_agent",  # torch.distributed.run, never hanging at exit
            *launch.torchrun_args(endpoint),
            "--tee=3",
            f"--log-dir={log_dir / f'node{index}-ranks'}",
            *launch.entrypoint,
            *launch.trainer_args(),
        ]
        log_path = log_dir / f"node{index}.log"
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            text=True,
            errors="replace",
            bufsize=1,
            start_new_session=True,
            preexec_fn=die_with_parent(),
        )
        node = _Node(index=index, proc=proc, log_path=log_path, tail=deque(maxlen=self.tail_lines))
        node.log_file = log_path.open("w", encoding="utf-8")
        node.log_file.write(f"$ {' '.join(cmd)}\n")
        node.reader = threading.Thread(
            target=self._pump, args=(node,), name=f"node{index}-log", daemon=True
        )
        node.reader.start()
        return node

    def _pump(self, node: _Node) -> None:
        """Prefix, tee and keep the tail of one agent's output (agent and worker lines). Once the
        launcher stops the agents, their own lines go to the node's log only: torchrun prints a
        Python traceback for the SIGTERM it is stopped with, which is no error of the run."""
        assert node.proc.stdout is not None and node.log_file is not None
        prefix = f"[node{node.index}"
        held: list[str] | None = None  # an agent traceback, shown unless it is _AGENT_NOISE
        for raw in node.proc.stdout:
            text = raw.rstrip("\n")
            shown = [text]
            if text.startswith(prefix):
                node.tail.append(text)
            else:
                node.agent_tail.append(f"[node{node.index}] {text}")
                if text.startswith("Traceback (most recent call last)"):
                    held = []
                if held is not None:
                    held.append(text)
                    shown = []
                    if not text.startswith((" ", "Traceback")):  # the exception line: its end
                        shown = [] if _AGENT_NOISE.match(text) else held
                        held = None
                shown = [] if self._stopping else [f"[node{node.index}] {t}" for t in shown]
            self._write_log(node, text if text.startswith(prefix) else node.agent_tail[-1])
            for line in shown:
                self.log(line)

    def _write_log(self, node: _Node, line: str) -> None:
        """One line to the node's log file. A log that cannot be written (a full disk) is given
        up with one line saying so: the node's output is still read (a worker blocked on a full
        pipe would hang) and shown, and the worker reports its own failure."""
        if node.log_file is None:
            return
        try:
            node.log_file.write(line + "\n")
            node.log_file.flush()
        except OSError as exc:
            log_file, node.log_file = node.log_file, None
            with contextlib.suppress(OSError):
                log_file.close()
            self.log(
                f"[launcher] node {node.index}'s log {node.log_path} can no longer be written ({exc.strerror})"
            )

    # ---- wait ---------------------------------------------------------------------------------

    def wait(self, *, timeout: float | None = None) -> LaunchResult:
        if self.launch is None or self._state is None:
            raise RuntimeError("start() a run before wait()")
        launch = self.launch
        deadline = None if timeout is None else time.monotonic() + timeout
        failed: _Node | None = None
        status, message = SUCCEEDED, ""
        try:
            while True:
                codes = [node.proc.poll() for node in self._nodes]
                bad = [n for n, c in zip(self._nodes, codes, strict=True) if c not in (None, 0)]
                if bad:
                    failed = bad[0]
                    status = FAILED
                    message = f"node {failed.index} exited with status {failed.proc.returncode}"
                    message += _worker_error(failed)
                    if any(c is None for c in codes):
                        self.log(f"[launcher] {message}: stopping the other nodes")
                    break
                if all(c == 0 for c in codes) or self._cancelled:
                    break
                if deadline is not None and time.monotonic() > deadline:
                    status, message = FAILED, f"timed out after {timeout:.0f}s"
                    self.log(f"[launcher] {message}: stopping every node")
                    break
                time.sleep(self.poll_s)
        finally:
            self._stop_all()
            self._finish()
        if self._cancelled:
            status, message, failed = CANCELLED, "cancelled", None
        return self.result(
            launch,
            status,
            message,
            started=self._started_at,
            exit_code=None if failed is None else failed.proc.returncode,
            failed_node=None if failed is None else failed.index,
            log_tail=_failure_tail(failed) if failed else [],
            details={
                "exit_codes": [n.proc.returncode for n in self._nodes],
                "logs": [str(n.log_path) for n in self._nodes],
            },
        )

    _cancelled = False
    _stopping = False
    """Set once the launcher stops the agents (cancel, a failed node, a timeout)."""

    def cancel(self) -> None:
        self._cancelled = True
        self._stop_all()
        self._finish()

    def _stop_all(self) -> None:
        if self.launch is None:
            return
        running = [n.proc.pid for n in self._nodes if n.proc.poll() is None]
        self._stopping = self._stopping or bool(running)
        marker = self.marker(self.launch.run_id)
        if running or marked_pids(marker):
            terminate_run_processes(marker, running, grace_s=self.grace_s)
        for node in self._nodes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.proc.wait(timeout=5)

    def _finish(self) -> None:
        """Close logs, stop the etcd we started and remove the run's state (once)."""
        with self._lock:
            if self._finished or self._state is None:
                return
            self._finished = True
        for node in self._nodes:
            if node.reader is not None:
                node.reader.join(timeout=10)
            if node.log_file is not None:
                with contextlib.suppress(OSError):  # a full disk: reported by _write_log
                    node.log_file.close()
            if node.proc.stdout is not None:
                node.proc.stdout.close()
        if self._store_port is not None:
            self._store_port.release()
        if self._state.etcd_started:
            # etcd's client imports requests (~200 modules): only for an etcd rendezvous
            from components.etcd import local as etcd_local

            etcd_local.stop(self._state.run_id, root=self._state_root)
        _remove_state(Path(self._state.state_dir))

    # ---- cleanup ------------------------------------------------------------------------------

    def cleanup(self, run_id: str) -> list[str]:
        removed: list[str] = []
        state = self._read_state(run_id)
        pgids = state.pgids if state else []
        if pgids or marked_pids(self.marker(run_id)):
            killed = terminate_run_processes(self.marker(run_id), pgids, grace_s=self.grace_s)
            removed.append(f"stopped the processes of run {run_id} ({killed} needed SIGKILL)")
        try:
            # etcd's client imports requests (~200 modules): only for an etcd rendezvous
            from components.etcd import local as etcd_local
        except ImportError:  # the etcd module is optional for c10d-only installs
            etcd_local = None  # type: ignore[assignment]
        if etcd_local is not None and etcd_local.stop(run_id, root=self._state_root):
            removed.append(f"stopped the local etcd of run {run_id}")
        if _remove_state(self.state_dir(run_id)):
            removed.append(f"removed the launcher state of run {run_id}")
        return removed


def _remove_state(state_dir: Path) -> bool:
    """Remove our state file, and the run's state dir once empty. Not rmtree: the dir is shared
    with the run's etcd (components/etcd/local.py), whose state must survive until it is stopped."""
    path = state_dir / STATE_FILE
    existed = path.exists()
    path.unlink(missing_ok=True)
    path.with_suffix(".tmp").unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        state_dir.rmdir()
        state_dir.parent.rmdir()  # the shared root too, once no run uses it
    return existed


_AGENT_NOISE = re.compile(r"^torch\.distributed\.elastic\.\S*(ChildFailedError|SignalException)")
"""The exception line of torchrun's own traceback when a worker failed (the "Root Cause" block
that follows says which and why) or when it was stopped by a signal: the terminal is spared the
traceback, the node's log keeps it."""
_WORKER_ERROR = re.compile(r"^\[node\d+ rank\d+\] error: (.+)$")
"""A worker's own one-line reason (what `python -m trainer` prints before exiting non-zero)."""


def _worker_error(node: _Node) -> str:
    """ ": <reason>" of the failing node's last worker `error:` line ("" when it printed none), so
    the run's one error line says why (a NaN loss at step N, a damaged shard), not only a code."""
    for line in reversed(node.tail):
        match = _WORKER_ERROR.match(line)
        if match:
            return f": {match.group(1)}"
    return ""


def _failure_tail(node: _Node) -> list[str]:
    """The failing node's last worker lines, then torchrun's "Root Cause" block (which rank, exit
    code, signal), skipping the agent's own Python traceback, which never helps."""
    agent = list(node.agent_tail)
    start = next((i for i, line in enumerate(agent) if "Root Cause" in line), None)
    if start is None:
        return [*node.tail, *agent[-10:]]
    return [*node.tail, *agent[start:]]
