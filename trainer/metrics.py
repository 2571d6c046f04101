"""Training metrics on rank 0: JSONL + TensorBoard + log line, and the FLOP accounting for MFU.

MFU = achieved model FLOP/s / peak FLOP/s of the devices. Model FLOPs per token follow the PaLM
paper's appendix B (Chowdhery et al. 2022): 6 x N (matmul parameters; forward 2N + backward 4N)
+ 12 x layers x hidden x seq_len (attention scores), counted for every token in a row, as is
conventional, although the LM head here runs only on target positions (so the work actually done
is smaller than the FLOPs credited, same as recomputation is not credited). With LoRA the frozen
weights need no weight gradients: 4 x N.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from trainer import storage
from trainer.gpu_peaks import peak_of
from trainer.tracking import SPOOL_FILE, TrackingSink

log = logging.getLogger(__name__)


def peak_flops(device: torch.device, override: float | None = None) -> float | None:
    """Peak FLOP/s of one device (trainer/gpu_peaks.py), or None when unknown (CPUs: no
    meaningful tensor peak)."""
    if override:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    peak = peak_of(name)
    if peak is None:
        log.warning("unknown GPU %r: MFU not reported (set peak_flops)", name)
    return peak


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


class MetricsWriter:
    """Rank 0 writes; other ranks get a writer whose methods do nothing.

    Object stores (gs://) cannot append, so for a remote output the JSONL file and the
    TensorBoard events are written to a local staging directory and copied up after every write.
    """

    def __init__(
        self,
        output: str,
        *,
        enabled: bool,
        tensorboard: bool,
        tracking_uri: str = "",
        tracking_run_id: str = "",
    ) -> None:
        self.enabled = enabled
        self._jsonl: Any = None
        self._tb: Any = None
        self.tracking: TrackingSink | None = None
        self._uploads: list[tuple[str, str]] = []  # (local path, remote URI)
        self._staging = ""
        if not enabled:
            return
        jsonl = output.rstrip("/") + "/metrics.jsonl"
        # Vertex AI sets AIP_TENSORBOARD_LOG_DIR when a TensorBoard instance is attached.
        logdir = os.environ.get("AIP_TENSORBOARD_LOG_DIR") or output.rstrip("/") + "/tensorboard"
        if storage.is_remote(output) or (tensorboard and storage.is_remote(logdir)):
            self._staging = tempfile.mkdtemp(prefix="llmft-metrics-")
        if tracking_uri:
            self.tracking = self._tracking_sink(output, tracking_uri, tracking_run_id)
        if storage.is_remote(jsonl):
            local = os.path.join(self._staging, "metrics.jsonl")
            if storage.exists(jsonl):  # a resumed run continues the same file
                storage.copy_to_local(jsonl, local)
            self._uploads.append((local, jsonl))
            jsonl = local
        else:
            jsonl = storage.local_path(jsonl)
        Path(jsonl).parent.mkdir(parents=True, exist_ok=True)
        self._jsonl = open(jsonl, "a")  # noqa: SIM115 -- closed in close()
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            if storage.is_remote(logdir):
                local = os.path.join(self._staging, "tensorboard")
                self._uploads.append((local, logdir))
                logdir = local
            self._tb = SummaryWriter(logdir)

    def _tracking_sink(self, output: str, uri: str, run_id: str) -> TrackingSink:
        """The MLflow sink; its spool is OUTPUT/mlflow-spool.jsonl (staged, for a remote run
        directory, and copied up at close)."""
        spool = storage.join(output, SPOOL_FILE)
        if storage.is_remote(spool):
            local = os.path.join(self._staging, SPOOL_FILE)
            self._uploads.append((local, spool))
            return TrackingSink(uri, run_id, local, shown_spool=spool)
        return TrackingSink(uri, run_id, storage.local_path(spool))

    def log_params(self, params: Mapping[str, Any]) -> None:
        """The run's resolved settings, once (MLflow only: the log has them already)."""
        if self.tracking is not None:
            self.tracking.log_params(params)

    def write(self, step: int, values: Mapping[str, float | int | None]) -> None:
        if not self.enabled:
            return
        if self.tracking is not None:  # a queue put: the thread sends it
            self.tracking.log_metrics(step, values)
        record = {"step": step, "time": time.time(), **values}
        self._jsonl.write(json.dumps(record) + "\n")
        self._jsonl.flush()
        if self._tb is not None:
            for key, value in values.items():
                if value is not None:
                    self._tb.add_scalar(f"train/{key}", value, step)
            self._tb.flush()
        self._sync()
        shown = " ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items()
        )
        log.info("step %d %s", step, shown)

    def _sync(self) -> None:
        for local, remote in self._uploads:
            if os.path.isdir(local):
                storage.upload_dir(local, remote)
            elif os.path.exists(local):
                storage.upload_file(local, remote)

    def close(self) -> None:
        if self.tracking is not None and not self.tracking.close():
            for local, remote in self._uploads:  # all arrived: no stale spool left remotely
                if local.endswith(SPOOL_FILE) and storage.exists(remote):
                    storage.remove(remote)
        if self._jsonl is not None:
            self._jsonl.close()
        if self._tb is not None:
            self._tb.close()
        if self._uploads:
            self._sync()
        if self._staging:
            shutil.rmtree(self._staging, ignore_errors=True)
