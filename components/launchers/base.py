"""The one launcher interface: start a training run on N nodes x P processes, follow it, cancel it,
and clean up after it by run id.

Every backend (local torchrun agents, a PyTorchJob on GKE, a Vertex AI CustomJob) implements
`Launcher` and takes its own typed options (`LocalOptions`, `GkeOptions`, `VertexOptions`: each a
`BackendOptions`, which names its backend and makes its launcher), so this module imports none of
its subclasses. What to run is described once, by `TrainLaunch`, so the trainer receives the same
arguments whatever starts it.

Why cleanup takes a run id rather than a handle: the pipeline's exit handler runs in another process
(often another machine) and cannot consume the train step's outputs, so it finds what a run created
from the run id alone (components/runtime/run_identity.py).
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, ClassVar, Protocol

from components.launchers.vocab import DEFAULT_RDZV_BACKEND, RDZV_BACKENDS
from components.runtime.run_identity import safe_run_id
from trainer.config import TrainConfig

TRAINER_ENTRYPOINT: tuple[str, ...] = ("-m", "trainer")
"""What torchrun runs in every worker: the trainer package (`python -m trainer`)."""

SUCCEEDED, FAILED, CANCELLED = "succeeded", "failed", "cancelled"

LogSink = Callable[[str], None]


def print_line(line: str) -> None:
    """Default log sink: one line to stdout, flushed (KFP and Vertex collect stdout)."""
    sys.stdout.write(line.rstrip("\n") + "\n")
    sys.stdout.flush()


@dataclass(frozen=True)
class TrainLaunch:
    """What to run, identical for every backend.

    Paths in `trainer` are as the workers see them: local paths for the local backend, gs:// URIs
    (or paths on a shared volume) for GKE and Vertex.
    """

    run_id: str
    """The pipeline run id; names, labels and the rendezvous id all derive from it."""
    trainer: TrainConfig
    """The trainer's whole config, handed to every rank as one JSON argument
    (`python -m trainer --config-json ...`), so no setting is re-encoded on the way."""
    nodes: int = 1
    """Number of nodes (torchrun agents / pods / Vertex replicas)."""
    nproc_per_node: int = 1
    """Worker processes per node (usually one per GPU)."""
    rdzv_backend: str = DEFAULT_RDZV_BACKEND
    """torchrun rendezvous backend: etcd-v3 (our plugin), etcd-v2 (etcd's v2 API) or c10d."""
    rdzv_endpoint: str = ""
    """`host:port` of the rendezvous; empty lets the backend choose (see each launcher)."""
    max_restarts: int = 0
    """torchrun restarts of the whole worker group after a worker failure."""
    entrypoint: tuple[str, ...] = TRAINER_ENTRYPOINT
    """What torchrun runs: `("-m", "trainer")`, or a script path (tests use a small one)."""

    @property
    def model(self) -> str:
        return self.trainer.model

    @property
    def data(self) -> str:
        return self.trainer.data

    @property
    def output(self) -> str:
        return self.trainer.output

    @property
    def rdzv_id(self) -> str:
        """Unique per run: torch defaults it to "none", so runs sharing an etcd would collide."""
        return safe_run_id(self.run_id)

    def accelerators_per_node(self, count: int | None, accelerator: str | None) -> int:
        """Accelerators per node: `count` when given, else one per process when an accelerator
        type is set, else none (CPU)."""
        if count is not None:
            return count
        return self.nproc_per_node if accelerator else 0

    def errors(self) -> list[str]:
        """Every problem with this launch, so the user fixes them in one go."""
        errors: list[str] = []
        try:
            safe_run_id(self.run_id)
        except ValueError as exc:
            errors.append(str(exc))
        if self.nodes < 1:
            errors.append(f"nodes={self.nodes}: need at least 1")
        if self.nproc_per_node < 1:
            errors.append(f"nproc_per_node={self.nproc_per_node}: need at least 1")
        if self.rdzv_backend not in RDZV_BACKENDS:
            errors.append(
                f"rdzv_backend={self.rdzv_backend!r}: choose one of {', '.join(RDZV_BACKENDS)}"
            )
        if self.rdzv_endpoint and not _is_host_port(self.rdzv_endpoint):
            errors.append(f"rdzv_endpoint={self.rdzv_endpoint!r}: expected host:port")
        if self.max_restarts < 0:
            errors.append(f"max_restarts={self.max_restarts}: cannot be negative")
        if not self.entrypoint:
            errors.append("entrypoint is empty")
        return errors + [f"trainer: {e}" for e in self.trainer.errors()]

    def validate(self) -> None:
        errors = self.errors()
        if errors:
            raise ValueError("invalid training launch:\n  - " + "\n  - ".join(errors))

    def trainer_args(self) -> list[str]:
        """Arguments of `python -m trainer` (after the entrypoint): the config as one JSON."""
        return ["--config-json", self.trainer.to_json()]

    def torchrun_args(self, endpoint: str, *, rdzv_conf: str = "") -> list[str]:
        """torchrun flags for one node agent (the same on every node)."""
        args = [
            f"--nnodes={self.nodes}",
            f"--nproc-per-node={self.nproc_per_node}",
            f"--rdzv-backend={self.rdzv_backend}",
            f"--rdzv-endpoint={endpoint}",
            f"--rdzv-id={self.rdzv_id}",
            f"--max-restarts={self.max_restarts}",
        ]
        if rdzv_conf:
            args.append(f"--rdzv-conf={rdzv_conf}")
        return args


def _is_host_port(value: str) -> bool:
    host, sep, port = value.rpartition(":")
    return bool(sep and host and port.isdigit() and 0 < int(port) < 65536)


TORCHRUN_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "PYTHONUNBUFFERED": "1"}
"""Set for every agent: with torch 2.13's shared rendezvous TCPStore, restarts after a worker
crash hung in most trials (pytorch/pytorch#135712); without it they recovered (docs/architecture.md)."""


@dataclass
class LaunchResult:
    """How a run ended. `status` is succeeded, failed or cancelled."""

    run_id: str
    backend: str
    status: str
    output: str
    message: str = ""
    exit_code: int | None = None
    failed_node: int | None = None
    log_tail: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == SUCCEEDED

    def describe(self) -> str:
        """A human summary: status, reason and the failing node's last log lines."""
        text = f"run {self.run_id} on {self.backend}: {self.status}"
        if self.message:
            text += f": {self.message}"
        if self.log_tail:
            text += "\nlast log lines:\n  " + "\n  ".join(self.log_tail)
        return text

    def raise_for_status(self) -> LaunchResult:
        if self.status == CANCELLED:
            raise LaunchCancelled(self)
        if self.status != SUCCEEDED:
            raise LaunchFailed(self)
        return self


class LaunchFailed(RuntimeError):
    """The training run failed; `result` says where and why."""

    def __init__(self, result: LaunchResult) -> None:
        super().__init__(result.describe())
        self.result = result


class LaunchCancelled(LaunchFailed):
    """The run was cancelled (SIGTERM, Ctrl-C or an explicit cancel)."""


class _Interrupted(BaseException):
    """Raised from a signal handler to leave the wait loop; BaseException so no `except
    Exception` in between swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextmanager
def _signals_raise() -> Iterator[None]:
    """Turn SIGTERM/SIGINT/SIGHUP into `_Interrupted` while waiting (main thread only: Python
    delivers signals there; elsewhere the caller's own handling applies). SIGHUP is a closed
    terminal: it cancels the run like SIGTERM instead of killing this process alone (unless it is
    ignored, as under `nohup`)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        raise _Interrupted(signum)

    signals = [signal.SIGTERM, signal.SIGINT]
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:  # `nohup llmft train` ignores it
        signals.append(signal.SIGHUP)
    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class BackendOptions(Protocol):
    """A backend's launch options (`LocalOptions`, `GkeOptions`, `VertexOptions`): their type is
    the backend. Code that handles any backend (components/steps/train.py) needs no import of the
    others' modules: `backend` names it, `launcher` makes its launcher."""

    backend: ClassVar[str]

    def launcher(self, *, log: LogSink | None = None) -> Launcher:
        """The launcher of this backend, following one run."""
        ...


class Launcher(ABC):
    """Start, follow, cancel and clean up one training run on one backend.

    One instance follows one run: `start(launch)`, then `wait()`; `cancel()` stops it;
    `cleanup(run_id)` removes whatever a run left behind and works from any process.
    """

    backend: ClassVar[str]

    def __init__(self, *, log: LogSink | None = None) -> None:
        self.log: LogSink = log or print_line
        self.launch: TrainLaunch | None = None

    @abstractmethod
    def start(self, launch: TrainLaunch) -> None:
        """Validate and start the run; returns once it is submitted / its processes are up."""

    @abstractmethod
    def wait(self, *, timeout: float | None = None) -> LaunchResult:
        """Follow the run (progress and logs to the log sink) until it ends or `timeout` passes
        (then it is cancelled and reported as failed). `timeout` counts from this call, except
        for a Vertex flex-start job, whose unbilled queue time is not counted: from its first
        JOB_STATE_RUNNING (components/launchers/vertex.py)."""

    @abstractmethod
    def cancel(self) -> None:
        """Stop the run started by this instance; safe to call twice or after it ended."""

    @abstractmethod
    def cleanup(self, run_id: str) -> list[str]:
        """Delete everything run `run_id` created on this backend; ignore what is already gone.

        Returns:
            Descriptions of what was removed or stopped.
        """

    def result(
        self, launch: TrainLaunch, status: str, message: str, *, started: float, **extra: Any
    ) -> LaunchResult:
        """`launch`'s result on this backend, timed from `started` (a `time.monotonic()`);
        `extra` are the backend's other `LaunchResult` fields (details, exit code, log tail).

        `details` always hold `started_at` and `ended_at` (ISO 8601, UTC), what the actual cost
        is computed from: the job's own times where the backend reports them, else this
        launcher's clock."""
        import datetime as dt

        duration = time.monotonic() - started
        now = dt.datetime.now(dt.UTC)
        details = dict(extra.pop("details", None) or {})
        details.setdefault("started_at", (now - dt.timedelta(seconds=duration)).isoformat())
        details.setdefault("ended_at", now.isoformat())
        return LaunchResult(
            run_id=launch.run_id,
            backend=self.backend,
            status=status,
            output=launch.output,
            message=message,
            duration_s=duration,
            details=details,
            **extra,
        )

    def run(self, launch: TrainLaunch, *, timeout: float | None = None) -> LaunchResult:
        """start + wait; SIGTERM / Ctrl-C, or any error of the launcher itself (an API call that
        kept failing, a bug), cancel what was started before the exception propagates: a
        launcher that stops following never leaves a training job running unwatched.

        Returns the result (check `.ok` or call `.raise_for_status()`).
        """
        started = time.monotonic()
        try:
            with _signals_raise():
                self.start(launch)
                return self.wait(timeout=timeout)
        except Exception as exc:
            self.log(f"[launcher] {type(exc).__name__}: {exc}; cancelling what was started")
            try:
                self.cancel()
            except Exception as cancel_error:  # report the first failure, not the cleanup's
                self.log(f"[launcher] cancelling failed too: {cancel_error}")
            raise
        except _Interrupted as interrupt:
            self.log(
                f"[launcher] signal {signal.Signals(interrupt.signum).name}: cancelling the run"
            )
            self.cancel()
            message = f"cancelled by {signal.Signals(interrupt.signum).name}"
            return self.result(launch, CANCELLED, message, started=started)


def tail(lines: Sequence[str], n: int) -> list[str]:
    return list(lines[-n:]) if n > 0 else []
