"""The chain with every URI on gs://, against a real GCS server (the `gcs_emulator` fixture).

Raw records and the base model are uploaded to a bucket; then, as a user would run them:
  1. `llmft preprocess` (DirectRunner) reads gs://, writes the packed dataset, rejected/ and the
     manifest to gs://;
  2. `llmft train` 2 nodes (x 2 processes in the full version, x 1 in the short one) reads model
     and data from gs://, checkpoints (DCP) to gs://; (full version:) a worker is killed (-9)
     after the first checkpoint lands in the bucket and torchrun's restart resumes from it;
     SIGTERM to `llmft train` once a metrics line is in the bucket saves and stops; a rerun
     resumes from the gs:// checkpoint and exports the Hugging Face model to gs://;
  3. `llmft evaluate` reads base, tuned model and data from gs://, writes metrics and the report;
  4. the register step uploads with artifact_uri = the gs:// model (the Vertex registry is the
     cloud boundary and stays faked, as in test_evaluate_registry.py).
Every wait is on a signal (an object appearing in the bucket, a log line), never on time.

The default run uses a short version (small data, few steps); `make rehearsal` runs the full one
(`pytest --rehearsal tests/test_gcs_chain.py`: the whole sample data, more steps, Beam with its
default worker count).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fakes.vertex import FakeModelService
from trainer_pause.sitecustomize import pause_env

from trainer import storage

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


@dataclass
class Chain:
    bucket: str
    full: bool
    env: dict[str, str]

    def uri(self, *parts: str) -> str:
        return storage.join(self.bucket, *parts)

    @property
    def max_steps(self) -> int:
        return 40 if self.full else 12

    @property
    def nproc_per_node(self) -> int:
        """2 nodes x 2 in the full version; 2 x 1 in the short one (two nodes reading gs:// into
        one cache, two ranks writing one DCP checkpoint, without two more trainer interpreters)."""
        return 2 if self.full else 1


PAUSE_AT_STEP = 2


def _lines(path: Path, n: int | None) -> str:
    lines = path.read_text().splitlines(keepends=True)
    return "".join(lines if n is None else lines[:n])


@pytest.fixture(scope="module")
def chain(
    request: pytest.FixtureRequest,
    gcs_emulator,
    sample_data_dir: Path,
    tiny_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Chain:
    full = bool(request.config.getoption("--rehearsal"))
    bucket = gcs_emulator.create_bucket("llmft-chain")
    # Clean and dirty records: the dirty ones fill rejected/.
    storage.write_text(
        f"{bucket}/raw/train.jsonl", _lines(sample_data_dir / "train.jsonl", None if full else 400)
    )
    storage.write_text(
        f"{bucket}/raw/dirty.jsonl", _lines(sample_data_dir / "dirty.jsonl", None if full else 200)
    )
    storage.upload_dir(tiny_model_dir, f"{bucket}/models/base")
    cache = tmp_path_factory.mktemp("node_cache")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "LLMFT_CACHE_DIR": str(cache),  # the "node's" download cache for gs:// models
        "OMP_NUM_THREADS": "1",
    }
    return Chain(bucket=bucket, full=full, env=env)


def llmft(chain: Chain, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args],
        cwd=REPO,
        env=chain.env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_preprocess_writes_dataset_rejected_and_manifest_to_gcs(chain: Chain) -> None:
    from trainer.packed_data.format import read_manifest

    beam = [] if chain.full else ["--direct_num_workers=1"]
    done = llmft(
        chain, "preprocess", "--input", chain.uri("raw/*.jsonl"), "--output",
        chain.uri("dataset"), "--tokenizer", chain.uri("models/base"), "--seq-len", "128",
        "--eval-fraction", "0.1", "--max-rejected-fraction", "0.9", *beam,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    manifest = read_manifest(chain.uri("dataset"))
    assert manifest.seq_len == 128
    assert manifest.splits["train"].rows > 0 and manifest.splits["eval"].rows > 0
    for split in ("train", "eval"):
        for shard in manifest.splits[split].shards:
            assert storage.exists(chain.uri("dataset", shard)), shard
    rejected = storage.glob(chain.uri("dataset/rejected/*"))
    assert rejected, storage.listdir(chain.uri("dataset"))
    reasons = {
        json.loads(line)["reason"]
        for path in rejected
        for line in storage.read_text(path).splitlines()
        if line.strip()
    }
    assert reasons, "the dirty records must land in rejected/ with a reason"


class Follower:
    """A running `llmft train`: its output lines, read as they come."""

    def __init__(self, chain: Chain, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pipelines.cli", "train", *args],
            cwd=REPO,
            env=env or chain.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line)
        self._queue.put(None)

    def wait_for(self, what: str, check: Callable[[], bool], timeout: float = 300) -> None:
        """Read output until `check()` holds (checked after every line and on idle)."""
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                pytest.fail(f"timed out waiting for {what}:\n" + self.tail())
            try:
                line = self._queue.get(timeout=1)
            except queue.Empty:
                continue  # no output for a second: look at the bucket again
            if line is None:
                if check():
                    return
                pytest.fail(f"llmft train ended before {what}:\n" + self.tail())
            self.lines.append(line)

    def saw(self, text: str) -> Callable[[], bool]:
        return lambda: any(text in line for line in self.lines)

    def finish(self, timeout: float = 600) -> int:
        deadline = time.monotonic() + timeout
        while (line := self._queue.get(timeout=max(1.0, deadline - time.monotonic()))) is not None:
            self.lines.append(line)
        return self.proc.wait(timeout=60)

    def tail(self) -> str:
        return "".join(self.lines[-80:])

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


@contextlib.contextmanager
def following(chain: Chain, *args: str, env: dict[str, str] | None = None) -> Iterator[Follower]:
    run = Follower(chain, *args, env=env)
    try:
        yield run
    finally:
        run.kill()  # nothing is left running, whatever happened


def _trainer_workers(run_id: str) -> list[int]:
    """PIDs of the trainer worker processes of a local run (not the torchrun agents)."""
    from components.launchers.run_processes import marked_pids
    from components.runtime.run_identity import run_state_dir

    pids = []
    # The marker is the run's state dir, under the LLMFT_STATE_DIR the chain's processes share.
    for pid in marked_pids(str(run_state_dir(run_id))):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        agent = b"components.launchers.torchrun_agent" in argv
        if b"trainer" in argv and b"-m" in argv and not agent:
            pids.append(pid)
    return sorted(pids)


def _complete_steps(chain: Chain) -> list[int]:
    from trainer.checkpoint_files import complete_checkpoints

    return [step for step, _ in complete_checkpoints(chain.uri("run/checkpoints"))]


def _metric_steps(chain: Chain) -> list[int]:
    path = chain.uri("run/metrics.jsonl")
    if not storage.exists(path):
        return []
    return [
        json.loads(line)["step"]
        for line in storage.read_text(path).splitlines()
        if line.strip() and "loss" in json.loads(line)
    ]


def test_train_on_gcs_is_interrupted_and_resumes(chain: Chain, tmp_path: Path) -> None:
    run_id = "gcs-chain"
    args = [
        "--model", chain.uri("models/base"), "--data", chain.uri("dataset"),
        "--output", chain.uri("run"), "--nodes", "2", "--nproc-per-node", str(chain.nproc_per_node),
        "--max-steps", str(chain.max_steps), "--run-id", run_id, "--max-restarts", "1",
        "--set", f"checkpoint_every={4 if chain.full else 1000}", "--set", "keep_checkpoints=2",
        "--set", "log_every=1", "--set", "micro_batch_size=2", "--set", "tensorboard=false",
        "--set", "eval_max_rows=8", "--set", f"eval_at_end={str(chain.full).lower()}",
    ]  # fmt: skip
    # The short run preempts where every rank waits (tests/trainer_pause); the full one after a
    # restart, once a step past the restart was logged.
    paused = tmp_path / "paused"
    paused.mkdir()
    env = None if chain.full else pause_env(PAUSE_AT_STEP, str(paused), chain.env)
    with following(chain, *args, env=env) as run:
        if chain.full:
            # kill -9 of one worker: torchrun restarts the group, which resumes from the gs://
            # checkpoint. (Left to the rehearsal: a restart costs about a minute here.)
            run.wait_for("a checkpoint in the bucket", lambda: bool(_complete_steps(chain)))
            workers = _trainer_workers(run_id)
            assert len(workers) == 2 * chain.nproc_per_node, (workers, run.tail())
            os.kill(workers[-1], signal.SIGKILL)
            run.wait_for("the restarted workers resuming", run.saw("resuming from gs://"))
            resumed_at = len(run.lines)
            run.wait_for(
                "a step after the restart",
                lambda: any("[trainer.metrics] step" in x for x in run.lines[resumed_at:]),
            )
        else:
            ranks = 2 * chain.nproc_per_node
            run.wait_for("every rank paused", lambda: len(list(paused.glob("paused.*"))) == ranks)
        # SIGTERM (a preemption) to `llmft train`: every rank saves, then the run stops.
        run.proc.send_signal(signal.SIGTERM)
        code = run.finish()
    assert code == 130, run.tail()
    assert any("SIGTERM: saved step" in line for line in run.lines), run.tail()
    saved = max(_complete_steps(chain))
    assert saved < chain.max_steps
    if not chain.full:  # the ranks agree to stop in the step after the pause
        assert saved == PAUSE_AT_STEP + 1, run.tail()
    assert not storage.exists(chain.uri("run/summary.json"))

    done = llmft(chain, "train", *[a if a != run_id else f"{run_id}-2" for a in args])
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    summary = json.loads(storage.read_text(chain.uri("run/summary.json")))
    assert summary["resumed_from_step"] == saved
    assert summary["steps"] == chain.max_steps
    assert summary["model_dir"] == chain.uri("run/model")
    files = {p.rsplit("/", 1)[-1] for p in storage.listdir(chain.uri("run/model"))}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= files
    steps = _metric_steps(chain)
    assert steps[-1] == chain.max_steps and set(range(1, chain.max_steps + 1)) <= set(steps)


def test_evaluate_reads_and_writes_gcs(chain: Chain) -> None:
    done = llmft(
        chain, "evaluate", "--base", chain.uri("models/base"), "--tuned", chain.uri("run/model"),
        "--data", chain.uri("dataset"), "--output", chain.uri("eval"),
        "--train-metrics", chain.uri("run/metrics.jsonl"),
        "--max-examples", "8" if chain.full else "2", "--max-eval-rows", "64" if chain.full else "8",
        "--max-new-tokens", "16",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    metrics = json.loads(storage.read_text(chain.uri("eval/metrics.json")))["metrics"]
    assert metrics["tuned_eval_loss"] < metrics["base_eval_loss"]
    assert "<html" in storage.read_text(chain.uri("eval/report.html")).lower()
    assert storage.exists(chain.uri("eval/generations.jsonl"))


def test_register_uploads_the_gcs_model(chain: Chain, fake_registry: FakeModelService) -> None:
    from components.params.step_params import request_of
    from components.steps.register import COMPONENT as REGISTER_STEP
    from components.steps.register import run

    summary = json.loads(storage.read_text(chain.uri("run/summary.json")))
    name = run(
        request_of(
            REGISTER_STEP,
            model_uri=summary["model_dir"],
            base_model=summary["base_model"],
            run_id="gcs-chain",
            project="my-project",
            region="us-central1",
            registered_model="llmft-chain",
            serving_image="us-docker.pkg.dev/my-project/serving/pytorch-vllm-serve:20251205_0916_RC01",
        )
    )
    upload = next(r for r in fake_registry.requests if type(r).__name__ == "UploadModelRequest")
    assert upload.model.artifact_uri == chain.uri("run/model")
    assert storage.exists(storage.join(upload.model.artifact_uri, "config.json"))
    assert name.endswith("@1")


def test_local_run_with_data_and_outputs_on_gcs(chain: Chain, tmp_path: Path) -> None:
    """`llmft run --backend local` with work_uri on gs://: local compute, data on GCS."""
    if not chain.full:
        pytest.skip("the whole pipeline takes minutes: `make rehearsal` runs it")
    work = chain.uri("work")
    done = llmft(
        chain, "run", "--backend", "local", "--param", f"work_uri={work}",
        "--param", f"train_data_uri={chain.uri('raw/train.jsonl')}",
        "--param", f"base_model={chain.uri('models/base')}", "--param", f"workdir={tmp_path}",
        "--param", "max_steps=8", "--param", "seq_len=128", "--param", "max_eval_examples=4",
        timeout=1200,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    runs = storage.listdir(storage.join(work, "runs"))
    assert len(runs) == 1, runs
    from trainer.packed_data.format import read_manifest

    assert read_manifest(storage.join(runs[0], "dataset")).splits["train"].rows > 0
    summary = json.loads(storage.read_text(storage.join(runs[0], "train", "summary.json")))
    assert summary["steps"] == 8
    assert storage.exists(storage.join(runs[0], "model", "config.json"))  # the Model artifact
