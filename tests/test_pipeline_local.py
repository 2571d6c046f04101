"""The whole fine-tune pipeline through kfp.local, as `llmft run --backend local` runs it:
Beam DirectRunner, a real local etcd, 2 torchrun agents x 2 processes over etcd-v3, evaluate, and
the exit-handler cleanup; DPO on preference pairs; plus the failure and interrupt paths.

Each path runs the command the way a person does: the successful run in a terminal (a
pseudo-terminal: the live table and the trainer's progress line), the failed one piped, and Ctrl-C
both ways (typed into the terminal; SIGINT to the process group as a shell sends it), as the two
deliver it differently. That the step table, verdict and exit code never depend on where the output
goes is held in process by tests/test_local_progress.py (it once took a second whole pipeline run
per outcome here: each run here costs minutes on 2 cores)."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.slow

LLMFT = [sys.executable, "-m", "pipelines.cli"]


def _run_processes(workdir: Path) -> list[psutil.Process]:
    """Live processes started for this run (they inherit LLMFT_STATE_DIR under the workdir)."""
    marker = str(workdir)
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if proc.pid == os.getpid():
            continue
        try:
            if marker in " ".join(proc.info["cmdline"] or []) or marker in proc.environ().get(
                "LLMFT_STATE_DIR", ""
            ):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _assert_nothing_left(workdir: Path) -> None:
    deadline = time.monotonic() + 60  # a failsafe: it returns once the processes are gone
    while _run_processes(workdir) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = [" ".join(p.cmdline()[:4]) for p in _run_processes(workdir)]
    assert not left, f"processes left behind: {left}"
    state = workdir / "state"
    remaining = [p for p in state.rglob("*") if p.is_file()] if state.exists() else []
    assert not remaining, f"run state left behind: {remaining}"


def _params(workdir: Path, assets: tuple[Path, Path], **extra: object) -> list[str]:
    from pipelines.local_run import QUICKSTART_PRESET

    data_dir, model_dir = assets
    params = {
        **QUICKSTART_PRESET,  # sized for the tiny model these runs use
        "workdir": str(workdir),
        "train_data_uri": str(data_dir / "train.jsonl"),
        "base_model": str(model_dir),
        "max_steps": 40,
        "max_eval_examples": 40,
        **extra,
    }
    args: list[str] = []
    for key, value in params.items():
        args += ["--param", f"{key}={json.dumps(value) if not isinstance(value, str) else value}"]
    return args


@pytest.fixture(scope="module")
def assets(sample_data_dir: Path, tiny_model_dir: Path) -> tuple[Path, Path]:
    return sample_data_dir, tiny_model_dir


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")
_ROW = re.compile(r"^[│|] (\S+)\s+[│|] (\w+)\s+[│|]", re.M)


def _as_a_foreground_job() -> None:
    """Ctrl-C reaches the command as it would from a shell prompt, even when the test runner was
    started in the background (`make test &`: a shell without job control ignores SIGINT in
    background jobs, exec keeps ignored signals, and Python then installs no Ctrl-C handler)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class CliRun:
    """`llmft ...` in a pseudo-terminal (mode "tty") or with stdout piped (mode "pipe")."""

    def __init__(self, args: list[str], mode: str) -> None:
        self.mode, self._chunks, self._lock = mode, [], threading.Lock()
        env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "100"}
        if mode == "tty":
            self.pid, self._fd = pty.fork()
            if self.pid == 0:  # the child: a new session whose controlling terminal is the pty
                _as_a_foreground_job()
                os.execvpe(LLMFT[0], [*LLMFT, *args], env)
            reader = self._read_pty
        else:
            self._proc = subprocess.Popen(
                [*LLMFT, *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
                preexec_fn=_as_a_foreground_job,
            )
            self.pid = self._proc.pid
            reader = self._read_pipe
        self._reader = threading.Thread(target=reader, daemon=True)
        self._reader.start()

    def _read_pty(self) -> None:
        while True:
            try:
                chunk = os.read(self._fd, 65536)
            except OSError:  # EIO: the terminal's last writer is gone
                return
            if not chunk:
                return
            with self._lock:
                self._chunks.append(chunk)

    def _read_pipe(self) -> None:
        assert self._proc.stdout is not None
        for chunk in iter(lambda: self._proc.stdout.read1(65536), b""):  # type: ignore[union-attr]
            with self._lock:
                self._chunks.append(chunk)

    @property
    def text(self) -> str:
        with self._lock:
            return _ANSI.sub("", b"".join(self._chunks).decode(errors="replace"))

    def interrupt(self) -> None:
        """Ctrl-C: typed into the terminal, or SIGINT to the process group as a shell sends it."""
        if self.mode == "tty":
            os.write(self._fd, b"\x03")
        else:
            os.killpg(self.pid, signal.SIGINT)

    def wait(self, timeout: float) -> int:
        try:
            if self.mode == "tty":
                deadline = time.monotonic() + timeout
                while time.monotonic() < deadline:
                    pid, status = os.waitpid(self.pid, os.WNOHANG)
                    if pid:
                        self._reader.join(timeout=30)
                        os.close(self._fd)
                        return os.waitstatus_to_exitcode(status)
                    time.sleep(0.2)
                raise TimeoutError
            code = self._proc.wait(timeout=timeout)
            self._reader.join(timeout=30)
            return code
        except (TimeoutError, subprocess.TimeoutExpired):
            os.killpg(self.pid, signal.SIGKILL)
            raise AssertionError(
                f"llmft did not finish in {timeout}s:\n{self.text[-3000:]}"
            ) from None

    def final_steps(self) -> dict[str, str]:
        """The step table printed last (the terminal's live frames come before it)."""
        text = self.text
        table = text[text.rindex("llmft fine-tune (local)") :]
        return dict(_ROW.findall(table))


def _latest_run(workdir: Path) -> Path:
    """The newest pipeline run's directory under the workdir's pipeline root."""
    return max(
        (workdir / "pipeline_root").glob("llmft-fine-tune-*"), key=lambda p: p.stat().st_mtime
    )


def _manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "preprocess" / "dataset" / "manifest.json").read_text())


def _evaluate_metrics(run_dir: Path) -> dict:
    """The evaluate step's Metrics artifact (kfp.local's executor output)."""
    output = json.loads((run_dir / "evaluate" / "executor_output.json").read_text())
    return output["artifacts"]["metrics"]["artifacts"][0]["metadata"]


ALL_SUCCEEDED = {
    "validate-inputs": "succeeded",
    "preprocess": "succeeded",
    "etcd-up": "succeeded",
    "train": "succeeded",
    "evaluate": "succeeded",
    "register": "skipped",
    "deploy": "succeeded",  # runs when the gate passed; serves only with deploy_endpoint set
    "cleanup": "succeeded",
}


def _log(workdir: Path) -> str:
    return "".join(p.read_text() for p in (workdir / "logs").glob("*.log"))


def test_local_pipeline_end_to_end(tmp_path: Path, assets: tuple[Path, Path]):
    mode = "tty"
    workdir = tmp_path / "run"
    run = CliRun(["run", "--backend", "local", *_params(workdir, assets, max_steps=20)], mode)
    code = run.wait(timeout=900)
    out = run.text
    assert code == 0, out[-3000:] + _log(workdir)[-5000:]
    assert run.final_steps() == ALL_SUCCEEDED, out[-3000:]
    assert "fine-tune succeeded" in out
    # the live line showed the trainer's progress
    assert re.search(r"train step \d+/20\s+loss \d", out), out[-3000:]
    # the tasks' own output went to the log, not through the table
    assert "Executing task" in _log(workdir) and "Executing task" not in out
    run_dir = _latest_run(workdir)
    model_dirs = list((run_dir / "train").rglob("config.json"))
    assert model_dirs, "no exported model"
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(model_dirs[0].parent)
    report = (run_dir / "evaluate" / "report").read_text()
    assert "<html" in report.lower() and "<img" in report.lower()
    # the training job's actual cost (local: its own clock, no GPU priced) reached the report,
    # and the validate step returned the estimate
    assert (
        "training GPU-hours" in report and "training starts / preemptions</dt><dd>1 / 0" in report
    )
    validated = json.loads((run_dir / "validate-inputs" / "executor_output.json").read_text())
    estimate = validated["parameterValues"]["cost_estimate"]
    assert estimate["optimizer_steps"] == 20 and estimate["usd"] == 0.0, estimate
    # the before/after metrics are printed, and the tuned model beats its base
    assert "before / after" in out and "quality gate: passed" in out
    metrics = _evaluate_metrics(run_dir)
    assert metrics["tuned_eval_loss"] < metrics["base_eval_loss"] - 1.0, metrics
    summary = json.loads((run_dir / "metrics.json").read_text())
    assert summary["succeeded"] and summary["metrics"] == metrics
    _assert_nothing_left(workdir)


def test_local_pipeline_dpo_reports_the_win_rate(tmp_path: Path, assets: tuple[Path, Path]):
    """objective=dpo end to end: preference pairs through the Beam graph, DPO on LoRA adapters,
    and the evaluate step's win rate on the held-out pairs (the base as reference), which is the
    trainer's own eval win rate. One node and process, piped: the paths above cover the rest.
    With `tracking_uri` on a local sqlite store: the run, as MLflow has it (a real server:
    tests/test_mlflow_tracking.py)."""
    data_dir, _ = assets
    records = [json.loads(line) for line in (data_dir / "train.jsonl").read_text().splitlines()]
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(
        "".join(
            json.dumps(
                {"prompt": r["prompt"], "chosen": r["response"], "rejected": "I do not know."}
            )
            + "\n"
            for r in records[:600]
        )
    )
    workdir = tmp_path / "run"
    params = _params(
        workdir, assets, train_data_uri=str(pairs), data_kind="preference", objective="dpo",
        trainer_overrides={"lora_rank": 8}, nodes=1, nproc_per_node=1, max_steps=20,
        tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
    )  # fmt: skip
    run = CliRun(["run", "--backend", "local", *params], "pipe")
    code = run.wait(timeout=900)
    out = run.text
    assert code == 0, out[-3000:] + _log(workdir)[-5000:]
    assert run.final_steps() == ALL_SUCCEEDED, out[-3000:]
    assert "win_rate" in out and "quality gate: passed" in out
    run_dir = _latest_run(workdir)
    manifest = _manifest(run_dir)
    assert manifest["data_kind"] == "preference" and manifest["stats"]["kept"] == 600
    metrics = _evaluate_metrics(run_dir)
    assert metrics["preference_pairs"] == manifest["splits"]["eval"]["documents"] // 2
    assert metrics["tuned_win_rate"] > 0.8 and metrics["tuned_reward_margin"] > 0, metrics
    assert metrics["tuned_eval_loss"] < metrics["base_eval_loss"], metrics  # DPO loss < log 2
    trained = json.loads(next((run_dir / "train").rglob("summary.json")).read_text())
    assert trained["eval_win_rate"] == pytest.approx(metrics["tuned_win_rate"], abs=1e-6)
    assert "Win rate on held-out pairs" in (run_dir / "evaluate" / "report").read_text()
    _assert_tracked(f"sqlite:///{tmp_path / 'mlflow.db'}", metrics, trained)
    _assert_nothing_left(workdir)


def test_local_pipeline_grpo_reports_the_reward_before_and_after(
    tmp_path: Path, assets: tuple[Path, Path]
):
    """objective=grpo end to end on the packaged task (`llmft sample-prompts`): prompt records
    with their answer column through the Beam graph (data_kind prompts), GRPO on LoRA adapters on
    one node and two processes, and the evaluate step's mean reward and pass rate before and
    after, the tuned model's equal to the trainer's end-of-run numbers; the gate's reward gain."""
    from pipelines.quickstart.prompts_task import write_prompts_task

    written = write_prompts_task(tmp_path / "task", n=120, seed=0)
    rewards = Path(written["rewards"]).read_text().strip()
    workdir = tmp_path / "run"
    params = _params(
        workdir, assets, train_data_uri=written["prompts"], data_kind="prompts",
        objective="grpo", rewards=rewards, nodes=1, nproc_per_node=2, max_steps=4,
        trainer_overrides={"lora_rank": 8, "grpo_group_size": 4, "micro_batch_size": 2,
                           "grpo_max_completion_tokens": 8},
        seq_len=64, eval_fraction=0.1,
    )  # fmt: skip
    run = CliRun(["run", "--backend", "local", *params], "pipe")
    code = run.wait(timeout=900)
    out = run.text
    assert code == 0, out[-3000:] + _log(workdir)[-5000:]
    assert run.final_steps() == ALL_SUCCEEDED, out[-3000:]
    run_dir = _latest_run(workdir)
    manifest = _manifest(run_dir)
    assert manifest["data_kind"] == "prompts" and manifest["stats"]["kept"] == 120
    metrics = _evaluate_metrics(run_dir)
    held_out = manifest["splits"]["eval"]["rows"]
    assert metrics["generation_examples"] == held_out > 0, metrics
    for key in ("base_mean_reward", "tuned_mean_reward", "base_pass_rate", "tuned_pass_rate"):
        assert key in metrics, metrics
    trained = json.loads(next((run_dir / "train").rglob("summary.json")).read_text())
    assert trained["objective"] == "grpo" and trained["world_size"] == 2
    assert trained["eval_reward"] == pytest.approx(metrics["tuned_mean_reward"], abs=1e-6)
    _assert_nothing_left(workdir)


def _assert_tracked(store: str, metrics: dict, trained: dict) -> None:
    """One MLflow run for the pipeline run, nested train and evaluate runs with the trainer's
    curve (log_every 10 of 20 steps) and the evaluation, and the passing model's version."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store)
    experiment = client.get_experiment_by_name("llmft")
    runs = {r.data.tags["llmft.step"]: r for r in client.search_runs([experiment.experiment_id])}
    assert set(runs) == {"pipeline", "train", "evaluate"}
    assert runs["pipeline"].data.tags["llmft.gate"] == "passed"
    assert runs["pipeline"].data.params["max_steps"] == "20"
    history = client.get_metric_history(runs["train"].info.run_id, "loss")
    assert sorted(m.step for m in history) == [10, 20]
    assert runs["train"].data.params["lora_rank"] == "8"
    evaluated = runs["evaluate"].data.metrics
    assert evaluated["tuned_win_rate"] == pytest.approx(metrics["tuned_win_rate"])
    (version,) = client.search_model_versions("")
    assert version.source == trained["model_dir"] and version.run_id == runs["evaluate"].info.run_id
    names = {a.path for a in client.list_artifacts(runs["evaluate"].info.run_id)}
    assert {"report.html", "metrics.json"} <= names
    beside = Path(store.removeprefix("sqlite:///")).parent / "mlflow-artifacts"
    assert list(beside.rglob("report.html")), "the artifacts are beside the store, not in ./mlruns"


def test_failure_in_train_still_runs_cleanup(tmp_path: Path, assets: tuple[Path, Path]):
    mode = "pipe"
    workdir = tmp_path / "run"
    # Valid as a parameter, fails on the trainer's ranks (CPU-only machine). One node and
    # process: the cleanup after a failed train does not depend on how many ranks failed, and
    # each rank is an interpreter importing torch and transformers.
    params = _params(
        workdir, assets, trainer_overrides={"backend": "nccl"}, nodes=1, nproc_per_node=1
    )
    run = CliRun(["run", "--backend", "local", *params], mode)
    code = run.wait(timeout=600)
    out = run.text
    assert code == 1, out[-3000:]
    assert run.final_steps() == {
        **ALL_SUCCEEDED,
        "train": "failed",
        "evaluate": "skipped",
        "register": "skipped",
        "deploy": "skipped",
    }, out[-3000:]
    assert "fine-tune failed: train" in out
    assert "backend=nccl needs GPUs" in _log(workdir)  # the trainer's own message reaches the log
    _assert_nothing_left(workdir)


def _training_started(workdir: Path) -> bool:
    """The trainer logged a step: its metrics.jsonl under the run's work directory has a record."""
    return any(p.stat().st_size > 0 for p in workdir.rglob("metrics.jsonl"))


def test_ctrl_c_stops_everything(tmp_path: Path, assets: tuple[Path, Path]):
    """In a terminal, the live table on: the one mode-dependent part of the runner
    (`local_run.py`: `live_table`), so piped output (the failure and SIGKILL tests) adds
    nothing to what Ctrl-C proves; the table's text in both modes is `test_local_progress.py`'s."""
    mode = "tty"
    workdir = tmp_path / "run"
    # 2 nodes x 1 process: two agents to stop, without two more trainer interpreters to start.
    params = _params(
        workdir, assets, max_steps=100000, trainer_overrides={"log_every": 1}, nproc_per_node=1
    )
    run = CliRun(["run", "--backend", "local", *params], mode)
    try:
        deadline = time.monotonic() + 600
        while not _training_started(workdir):
            assert time.monotonic() < deadline, "training never started:\n" + run.text[-3000:]
            time.sleep(0.5)
        run.interrupt()
        code = run.wait(timeout=180)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)
    out = run.text
    assert code == 1, out[-3000:]
    steps = run.final_steps()
    assert steps["train"] == "failed" and steps["preprocess"] == "succeeded", out[-3000:]
    assert steps["evaluate"] == "skipped" and steps["register"] == "skipped", out[-3000:]
    assert "fine-tune failed" in out and "interrupted" in out
    _assert_nothing_left(workdir)
