"""MLflow tracking from rank 0, off the training step's critical path, never failing the run.

The train step (components/serving/mlflow_tracking.py) creates the pipeline run's MLflow run and
its nested `train` run and hands the nested run's id to the trainer (`TrainConfig.tracking_uri`,
`tracking_run_id`). Rank 0's MetricsWriter then gives every metrics record (loss, lr, tokens/s,
MFU, peak memory, with its step) and the resolved trainer config to a `TrackingSink`:

- `log_metrics` / `log_params` only put the record on a bounded queue (no I/O, no mlflow import
  on the caller's thread); a daemon thread sends them with `MlflowClient.log_batch`.
- A server that is unreachable or failing is one warning; records go to a local spool (JSONL,
  OUTPUT/mlflow-spool.jsonl) and the thread retries the spool every `retry_s`, and once more at
  `close()`. What still cannot be sent stays in the spool, and close() says where and how to
  replay it:

      python -m trainer.tracking replay OUTPUT/mlflow-spool.jsonl [--tracking-uri URI]

- A full queue (a server slower than the steps) sends the record to the spool, not back-pressure
  on the step.

The MLflow client's own HTTP retries (7 with exponential back-off by default: minutes per call)
are turned off in the trainer (`_SPOOLING_CLIENT_ENV`): the spool is the retry. The token of a
server that needs one is MLflow's own `MLFLOW_TRACKING_TOKEN` (from a secret by name, set by the
step; never a config value).

Importing mlflow costs ~1 s: it is imported in the sink's thread, only when tracking is on.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import math
import os
import queue
import socket
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

log = logging.getLogger(__name__)

TRACKING_SCHEMES = ("http", "https", "file", "sqlite")
"""What `tracking_uri` may be: an MLflow server, or a local file/SQLite store."""
TOKEN_ENV = "MLFLOW_TRACKING_TOKEN"
"""MLflow's own env var for a server's bearer token (read by its REST client)."""
SPOOL_FILE = "mlflow-spool.jsonl"
"""Records the server did not take, under the run directory."""
_SPOOLING_CLIENT_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
"""The trainer's client: no retries of its own (the spool is the retry), a short timeout."""
_STEP_CLIENT_ENV = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3",  # back-off 2, 4, 8 s: a server restarting
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "60",  # a loaded server's first sqlite writes
    # stdout is the commands' JSON (`llmft train/evaluate`): the run's URL goes to the log.
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
}
"""A step's client (components/serving/mlflow_tracking.py), unless the environment says
otherwise: a few retries before its warning."""
_BATCH_METRICS = 1000  # MLflow's log_batch limit
_MAX_PARAM_CHARS = 6000  # MLflow's param value limit
_STOP = object()


def tracking_uri_problem(uri: str, *, resolve: bool = True) -> str | None:
    """What is wrong with `uri` as a tracking URI (None: fine; "" is "off" and fine). With
    `resolve`, an http(s) server's host must resolve here (the step starts no job otherwise).
    Messages show the URI without credentials."""
    if not uri:
        return None
    parsed = urlparse(uri)
    shown = redact(uri)
    if parsed.password or parsed.username:
        return (
            f"tracking_uri={shown!r} carries credentials: give the server's token by secret "
            "name (tracking_token_secret) instead"
        )
    if parsed.scheme not in TRACKING_SCHEMES:
        return (
            f"tracking_uri={shown!r}: the scheme must be one of "
            f"{', '.join(s + '://' for s in TRACKING_SCHEMES)} (an MLflow server, or a local "
            "file:/sqlite: store)"
        )
    if parsed.scheme in ("http", "https"):
        if not parsed.hostname:
            return f"tracking_uri={shown!r}: no host (e.g. http://mlflow.kubeflow:5000)"
        if resolve:
            try:
                socket.getaddrinfo(parsed.hostname, parsed.port or 443, type=socket.SOCK_STREAM)
            except (socket.gaierror, UnicodeError) as exc:
                return f"tracking_uri={shown!r}: host {parsed.hostname!r} does not resolve ({exc})"
    elif not (parsed.path or parsed.netloc):
        return f"tracking_uri={shown!r}: no path (e.g. sqlite:////abs/path/mlflow.db)"
    return None


def redact(uri: str) -> str:
    """`uri` without credentials, as it may be logged."""
    parsed = urlparse(uri)
    if parsed.username or parsed.password:
        host = parsed.hostname or ""
        return parsed._replace(netloc=f"{host}:{parsed.port}" if parsed.port else host).geturl()
    return uri


def mlflow_client(uri: str, *, spooling: bool = False) -> Any:
    """MLflow's client for `uri`; `spooling` (the trainer's sink, whose spool retries) sets
    this process's MLflow HTTP settings to no retries and a short timeout (a launcher's child
    inherits the step's), else the step's defaults fill in what the environment does not set."""
    set_client_env(spooling=spooling)
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def set_client_env(*, spooling: bool) -> None:
    """The MLflow HTTP settings `mlflow_client` uses, set only where they differ: the sink sets
    them in the training thread before its own thread starts, so that thread never calls
    setenv while training code reads the environment (glibc's setenv is not safe beside getenv)."""
    wanted = dict(_SPOOLING_CLIENT_ENV) if spooling else {}
    defaults = {"MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"} if spooling else _STEP_CLIENT_ENV
    wanted |= {k: v for k, v in defaults.items() if k not in os.environ}
    for key, value in wanted.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


def _finite(values: Mapping[str, Any]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in values.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }


def send(client: Any, run_id: str, record: Mapping[str, Any]) -> None:
    """Send one spool/queue record: {"metrics": [[key, value, ms, step], ...]} or {"params": {}}."""
    from mlflow.entities import Metric, Param
    from mlflow.exceptions import MlflowException

    if params := record.get("params"):
        items = [Param(k, str(v)[:_MAX_PARAM_CHARS]) for k, v in params.items()]
        for start in range(0, len(items), 100):  # log_batch takes at most 100 params
            try:
                client.log_batch(run_id, params=items[start : start + 100])
            except MlflowException as exc:
                if exc.error_code != "INVALID_PARAMETER_VALUE":
                    raise
                # A resumed run whose settings changed: MLflow params are write-once.
                log.warning("MLflow kept the first values of the run's params: %s", exc.message)
    metrics = [Metric(k, v, ms, step) for k, v, ms, step in record.get("metrics", [])]
    for start in range(0, len(metrics), _BATCH_METRICS):
        client.log_batch(run_id, metrics=metrics[start : start + _BATCH_METRICS])


class TrackingSink:
    """Rank 0's MLflow logger: a background thread, a bounded queue and a local spool.

    Args:
        uri: the tracking URI (`tracking_uri_problem` says what is accepted).
        run_id: the MLflow run the records go to (the train step's nested run).
        spool_path: the local spool file.
        shown_spool: where the spool ends up (a remote run directory), for the closing line.
        queue_size: records held before they go to the spool instead.
        retry_s: how often the thread retries a server that failed.
    """

    def __init__(
        self,
        uri: str,
        run_id: str,
        spool_path: str | Path,
        *,
        shown_spool: str = "",
        queue_size: int = 1024,
        retry_s: float = 30.0,
    ) -> None:
        self.uri = uri
        self.run_id = run_id
        self.spool_path = Path(spool_path)
        self.shown_spool = shown_spool or str(self.spool_path)
        self.retry_s = retry_s
        self.sent = 0
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
        self._overflow: collections.deque[dict[str, Any]] = collections.deque()
        """Records that found the queue full; only the thread writes the spool."""
        self._client: Any = None
        self._retry_at = 0.0
        self._warned = False
        set_client_env(spooling=True)  # here, before the thread: it then never calls setenv
        self._thread = threading.Thread(target=self._loop, name="mlflow-tracking", daemon=True)
        self._thread.start()

    # --- the training thread's side: never blocks, never raises --------------------------------
    def log_metrics(self, step: int, values: Mapping[str, Any]) -> None:
        ms = int(time.time() * 1000)
        self._put({"metrics": [[k, v, ms, step] for k, v in _finite(values).items()]})

    def log_params(self, params: Mapping[str, Any]) -> None:
        self._put({"params": {k: v for k, v in params.items() if v is not None}})

    def _put(self, record: dict[str, Any]) -> None:
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self._overflow.append(record)

    # --- the thread ------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            batch = [first]
            while first is not _STOP and len(batch) < 64:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            records = [r for r in batch if r is not _STOP]
            self._spool_overflow()
            if records:
                self._deliver(records)
            if any(r is _STOP for r in batch):
                return

    def _deliver(self, records: list[dict[str, Any]]) -> None:
        if time.monotonic() < self._retry_at:
            self._spool(records)
            return
        sent = 0
        try:  # tracking must never fail training: any error is a warning and a spool
            if self.spool_path.exists():
                self._replay_spool()
            for record in records:
                self._send(record)
                sent += 1
        except Exception as exc:
            self._spool(records[sent:])
            self._failed(exc)

    def _send(self, record: Mapping[str, Any]) -> None:
        if self._client is None:
            self._client = mlflow_client(self.uri, spooling=True)
        send(self._client, self.run_id, record)
        self.sent += 1

    def _failed(self, exc: BaseException) -> None:
        self._retry_at = time.monotonic() + self.retry_s
        if not self._warned:
            self._warned = True
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            log.warning(
                "MLflow at %s failed (%s: %s): training goes on; records are spooled to %s "
                "and retried every %.0fs",
                redact(self.uri),
                type(exc).__name__,
                first,
                self.shown_spool,
                self.retry_s,
            )

    def _spool(self, records: list[dict[str, Any]]) -> None:
        if not records:
            return
        try:
            self.spool_path.parent.mkdir(parents=True, exist_ok=True)
            with self.spool_path.open("a") as f:
                for record in records:
                    f.write(json.dumps({"run_id": self.run_id, **record}) + "\n")
        except OSError as exc:
            log.warning("could not spool %d tracking records: %s", len(records), exc)

    def _spool_overflow(self) -> None:
        records = []
        while self._overflow:
            records.append(self._overflow.popleft())
        self._spool(records)

    def _replay_spool(self) -> None:
        """Send the spool's records in order; what is not sent stays in it."""
        lines = self.spool_path.read_text().splitlines()
        for i, line in enumerate(lines):
            try:
                self._send(json.loads(line))
            except Exception:
                self.spool_path.write_text("".join(x + "\n" for x in lines[i:]))
                raise
        self.spool_path.unlink()

    # --- the end ---------------------------------------------------------------------------------
    def close(self, timeout_s: float = 60.0) -> int:
        """Send what is queued and retry the spool once more; returns the records left in the
        spool (0: all arrived), after a line saying where they are."""
        with contextlib.suppress(queue.Full):  # then the join below times out, and says so
            self._queue.put(_STOP, timeout=timeout_s)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("MLflow at %s did not answer within %.0fs", redact(self.uri), timeout_s)
            return self.left()
        self._spool_overflow()
        if self.spool_path.exists():
            try:
                self._replay_spool()
                log.info("MLflow at %s is back: the spooled records arrived", redact(self.uri))
            except Exception as exc:
                self._failed(exc)
        left = self.left()
        if left:
            log.warning(
                "%d tracking records did not reach MLflow at %s; they are in %s: replay with "
                "`python -m trainer.tracking replay %s --tracking-uri %s` once it is back",
                left,
                redact(self.uri),
                self.shown_spool,
                self.shown_spool,
                redact(self.uri),
            )
        return left

    def left(self) -> int:
        """Records in the spool (call after close())."""
        if not self.spool_path.exists():
            return 0
        return len(self.spool_path.read_text().splitlines()) + len(self._overflow)


def replay(spool: str, uri: str) -> int:
    """Send a spool file's records (each to its own run id) and remove it; returns the count."""
    client = mlflow_client(uri)
    lines = Path(spool).read_text().splitlines()
    for line in lines:
        record = json.loads(line)
        send(client, record["run_id"], record)
    Path(spool).unlink()
    return len(lines)


def main(argv: list[str]) -> int:
    """`python -m trainer.tracking replay SPOOL --tracking-uri URI` (URI: $MLFLOW_TRACKING_URI)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m trainer.tracking")
    parser.add_argument("command", choices=["replay"])
    parser.add_argument("spool")
    parser.add_argument("--tracking-uri", default=os.environ.get("MLFLOW_TRACKING_URI", ""))
    args = parser.parse_args(argv)
    if problem := tracking_uri_problem(args.tracking_uri) or (
        None if args.tracking_uri else "--tracking-uri (or MLFLOW_TRACKING_URI) is required"
    ):
        print(f"error: {problem}", file=sys.stderr)
        return 2
    sent = replay(args.spool, args.tracking_uri)
    print(f"replayed {sent} records from {args.spool} to {redact(args.tracking_uri)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
