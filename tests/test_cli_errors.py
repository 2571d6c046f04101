"""Every user mistake the parameter issue lists: exit 2, one line starting `error:`, no traceback,
and nothing created, started or deleted first.

Commands run through typer's CliRunner (the real `llmft` app, in process) unless a fresh process
matters (no credentials in the environment), then as a subprocess.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from pipelines.cli import app

ROOT = Path(__file__).resolve().parents[1]


def llmft(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def assert_user_error(result: Any, *fragments: str) -> None:
    output = result.output
    assert result.exit_code == 2, output
    assert output.startswith("error: "), output
    assert "Traceback" not in output, output
    for fragment in fragments:
        assert fragment in output, (fragment, output)


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """A small packed dataset made with the tiny model's tokenizer."""
    from packed_fixtures import write_packed_dataset
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    records = [{"prompt": f"what is {i}+{i}?", "response": f"{2 * i}"} for i in range(40)]
    out = tmp_path_factory.mktemp("packed")
    write_packed_dataset(out, tokenizer, {"train": records[:32], "eval": records[32:]}, seq_len=64)
    return out


def _edited_copy(src: Path, dst: Path, file: str, **changes: Any) -> Path:
    shutil.copytree(src, dst)
    data = json.loads((dst / file).read_text())
    for key, value in changes.items():
        target = data
        *parents, leaf = key.split(".")
        for part in parents:
            target = target[part]
        target[leaf] = value
    (dst / file).write_text(json.dumps(data))
    return dst


# --- llmft train: everything is found before torchrun starts ---------------------------------


@pytest.mark.parametrize("steps", ["-5", "0"])
def test_train_refuses_non_positive_max_steps(tmp_path: Path, steps: str) -> None:
    result = llmft(
        "train", "--model", "m", "--data", "d", "--output", str(tmp_path / "o"),
        "--max-steps", steps,
    )  # fmt: skip
    assert_user_error(result, f"max_steps must be >= 1 or unset (got {steps})")
    assert not (tmp_path / "o").exists()


def test_train_refuses_a_model_that_is_neither_a_directory_nor_a_hub_id(
    tmp_path: Path, packed: Path
) -> None:
    result = llmft(
        "train", "--model", "tiny_model", "--data", str(packed), "--output", str(tmp_path)
    )
    assert_user_error(result, "model 'tiny_model' is not a directory here nor a hub id")
    assert not (tmp_path / "logs").exists()  # no torchrun agent was started


def test_train_refuses_data_packed_with_another_tokenizer(
    tmp_path: Path, packed: Path, tiny_model_dir: Path
) -> None:
    other = _edited_copy(
        packed, tmp_path / "data", "manifest.json", **{"tokenizer.fingerprint": "x"}
    )
    result = llmft(
        "train",
        "--model",
        str(tiny_model_dir),
        "--data",
        str(other),
        "--output",
        str(tmp_path / "o"),
    )
    assert_user_error(result, "tokenizer mismatch on fingerprint")


def test_train_refuses_rows_longer_than_the_model_positions(
    tmp_path: Path, packed: Path, tiny_model_dir: Path
) -> None:
    short = _edited_copy(
        tiny_model_dir, tmp_path / "model", "config.json", max_position_embeddings=32
    )
    result = llmft(
        "train", "--model", str(short), "--data", str(packed), "--output", str(tmp_path / "o")
    )
    assert_user_error(result, "has 32 positions but the dataset's rows are 64 tokens")


def test_train_refuses_an_empty_dataset(tmp_path: Path, packed: Path, tiny_model_dir: Path) -> None:
    empty = _edited_copy(packed, tmp_path / "data", "manifest.json", **{"splits.train.rows": 0})
    result = llmft(
        "train",
        "--model",
        str(tiny_model_dir),
        "--data",
        str(empty),
        "--output",
        str(tmp_path / "o"),
    )
    assert_user_error(result, "has no training rows")


def test_train_refuses_an_output_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "out").write_text("mine")
    result = llmft("train", "--model", "m", "--data", "d", "--output", str(tmp_path / "out"))
    assert_user_error(result, "is a file")
    assert (tmp_path / "out").read_text() == "mine"


# --- llmft preprocess: --overwrite deletes only what a previous run listed ---------------------


def test_preprocess_overwrite_keeps_a_directory_that_is_not_ours(
    tmp_path: Path, sample_data_dir: Path, tiny_model_dir: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("keep me")
    (home / "stats.json").write_text("{}")  # a file that happens to share our name
    result = llmft(
        "preprocess", "--input", str(sample_data_dir / "train.jsonl"), "--output", str(home),
        "--tokenizer", str(tiny_model_dir), "--seq-len", "128", "--overwrite",
    )  # fmt: skip
    assert_user_error(result, "so --overwrite will not delete it", "notes.txt")
    assert sorted(p.name for p in home.iterdir()) == ["notes.txt", "stats.json"]


def test_preprocess_refuses_an_output_that_is_a_file(
    tmp_path: Path, sample_data_dir: Path, tiny_model_dir: Path
) -> None:
    (tmp_path / "out").write_text("mine")
    result = llmft(
        "preprocess", "--input", str(sample_data_dir / "train.jsonl"),
        "--output", str(tmp_path / "out"), "--tokenizer", str(tiny_model_dir), "--seq-len", "128",
    )  # fmt: skip
    assert_user_error(result, "is a file")


def test_preprocess_refuses_the_local_runner_mode_that_loses_records(
    tmp_path: Path, sample_data_dir: Path, tiny_model_dir: Path
) -> None:
    result = llmft(
        "preprocess", "--input", str(sample_data_dir / "train.jsonl"),
        "--output", str(tmp_path / "out"), "--tokenizer", str(tiny_model_dir), "--seq-len", "128",
        "--direct_running_mode", "multi_threading",
    )  # fmt: skip
    assert_user_error(result, "multi_threading loses records")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.integration  # a Beam pipeline run
def test_preprocess_fails_on_input_where_every_record_is_filtered(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    data = tmp_path / "short.jsonl"
    data.write_text("".join(json.dumps({"prompt": "", "response": ""}) + "\n" for _ in range(5)))
    result = llmft(
        "preprocess", "--input", str(data), "--output", str(tmp_path / "out"),
        "--tokenizer", str(tiny_model_dir), "--seq-len", "128", "--max-rejected-fraction", "1",
        "--direct_num_workers", "1",
    )  # fmt: skip
    assert_user_error(result, "no training rows")
    assert not (tmp_path / "out" / "manifest.json").exists()


# --- llmft run: parameters checked before anything is written or contacted --------------------


def test_run_local_with_a_bad_parameter_writes_nothing(tmp_path: Path) -> None:
    workdir = tmp_path / "run"
    result = llmft(
        "run", "--param", f"workdir={workdir}", "--param", "seq_len=abc",
        "--param", "nodes=0", "--param", "rdzv_backend=zk",
    )  # fmt: skip
    assert_user_error(result, "seq_len='abc': must be an integer")
    assert not workdir.exists()
    result = llmft("run", "--param", f"workdir={workdir}", "--param", "nodes=0")
    assert_user_error(result, "nodes=0: use a value >= 1")
    assert not workdir.exists()


def test_run_local_with_missing_data_writes_nothing(tmp_path: Path) -> None:
    workdir = tmp_path / "run"
    result = llmft("run", "--param", f"workdir={workdir}", "--param", "train_data_uri=/nonexistent")
    assert_user_error(result, "train_data_uri='/nonexistent' matches no file")
    assert not workdir.exists()


def test_run_local_with_a_malformed_config(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("parameters: {seq_len: [1,\n")
    result = llmft("run", "--config", str(config), "--param", f"workdir={tmp_path / 'run'}")
    assert_user_error(result, "is not valid YAML")
    assert not (tmp_path / "run").exists()


def _fresh_llmft(
    *args: str, cwd: Path = ROOT, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """A new process with no Google credentials and no KFP endpoint in its environment (then
    `env` on top)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GOOGLE_", "KF_", "CLOUDSDK"))}
    base |= {"HOME": str(cwd), "NO_GCE_CHECK": "True", "GCE_METADATA_HOST": "127.0.0.1:1"}
    env = base | (env or {})
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize(
    "backend_flags",
    [
        ["--backend", "vertex", "--project", "my-project", "--pipeline-root", "gs://b/root"],
        ["--backend", "kfp", "--host", "http://127.0.0.1:9", "--pipeline-root", "gs://b/root"],
    ],
)
@pytest.mark.integration  # a fresh `llmft` process
def test_cloud_run_checks_parameters_before_credentials_or_server(
    backend_flags: list[str],
) -> None:
    result = _fresh_llmft(
        "run", *backend_flags, "--param", "seq_len=4", "--param", "train_data_uri=gs://b/d/*.jsonl",
        "--param", "base_model=gs://b/m", "--param", "namespace=Not_A_Name",
    )  # fmt: skip
    err = result.stderr
    assert result.returncode == 2, err
    assert err.startswith("error: ") and "Traceback" not in err, err
    assert "seq_len=4" in err and "namespace='Not_A_Name'" in err, err
    assert "credentials" not in err and "connect" not in err.lower(), err


@pytest.mark.integration  # a fresh `llmft` process
def test_cloud_schedule_checks_parameters_before_credentials() -> None:
    result = _fresh_llmft(
        "schedule", "--backend", "vertex", "--project", "my-project", "--pipeline-root",
        "gs://b/root", "--cron", "0 3 * * 1", "--param", "max_steps=0",
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: ") and "max_steps=0" in result.stderr, result.stderr
    assert "credentials" not in result.stderr


# --- the remaining tracebacks -------------------------------------------------------------------


def test_compile_refuses_an_output_dir_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "out").write_text("mine")
    assert_user_error(llmft("compile", "--output-dir", str(tmp_path / "out")), "is a file")


def test_evaluate_refuses_a_bogus_device_and_a_file_output(
    tmp_path: Path, packed: Path, tiny_model_dir: Path
) -> None:
    common = ["evaluate", "--base", str(tiny_model_dir), "--tuned", str(tiny_model_dir)]
    common += ["--data", str(packed)]
    result = llmft(*common, "--output", str(tmp_path / "o"), "--device", "bogus")
    assert_user_error(result, "device 'bogus' is not a torch device")
    (tmp_path / "file").write_text("mine")
    result = llmft(*common, "--output", str(tmp_path / "file"))
    assert_user_error(result, "is a file")


@pytest.mark.parametrize("backend", ["vertex", "kfp"])
def test_cloud_run_with_a_malformed_config(tmp_path: Path, backend: str) -> None:
    config = tmp_path / "deploy.yaml"
    config.write_text("vertex: {project: [\n")
    assert_user_error(llmft("run", "--backend", backend, "--config", str(config)), "not valid YAML")


_DRY_RUN_PARAMS = [
    "--param", "train_data_uri=gs://b/d/*.jsonl", "--param", "base_model=gs://b/m",
    "--param", "project=my-project", "--param", "work_uri=gs://b/w",
    "--param", "dataflow_service_account=llmft-dataflow@my-project.iam.gserviceaccount.com",
    # The model's size given: the estimate would otherwise read gs://b/m/config.json, which
    # this offline machine retries for most of a minute.
    "--param", "model_parameters=7000000000",
]  # fmt: skip
_DRY_RUN_BACKENDS = {
    "vertex": ["--backend", "vertex", "--project", "my-project", "--pipeline-root", "gs://b/root"],
    "kfp": ["--backend", "kfp", "--host", "http://127.0.0.1:9", "--pipeline-root", "gs://b/root"],
}


@pytest.mark.parametrize(
    ("backend", "changes", "fragment"),
    [
        ("vertex", [], ""),
        ("kfp", ["service_account=llmft-trainer"], ""),
        # N15: Vertex would reject L4s on an A3 machine only at create_custom_job.
        (
            "vertex",
            ["accelerator_type=NVIDIA_L4", "accelerator_count=8", "machine_type=a3-highgpu-8g"],
            "use g2-standard-96",
        ),
        # GKE: the pods ask for 8 L4s; the pool's g2-standard-24 nodes carry 2.
        (
            "kfp",
            ["accelerator_type=NVIDIA_L4", "accelerator_count=8", "machine_type=g2-standard-24"],
            "carries 2 x",
        ),
        # Review P1: the evaluate task's request (4 CPU / 16G) fits no g2-standard-4 GPU node;
        # a g2-standard-12 node hosts it now that it no longer requests its 12 CPU / 48G limit.
        (
            "kfp",
            ["accelerator_type=NVIDIA_L4", "accelerator_count=1", "machine_type=g2-standard-4"],
            "the evaluate task requests 4 CPU",
        ),
        (
            "kfp",
            [
                "accelerator_type=NVIDIA_L4",
                "accelerator_count=1",
                "machine_type=g2-standard-12",
                "service_account=llmft-trainer",
            ],
            "",
        ),
        # N17
        ("vertex", ["dataflow_service_account="], "dataflow_service_account is empty"),
    ],
)
def test_dry_run_checks_the_launch_against_the_platform_facts(
    backend: str, changes: list[str], fragment: str
) -> None:
    """`llmft run --dry-run` stops before credentials or a server: exit 0 when the launch can be
    scheduled, else exit 2 with the fix."""
    extra = [arg for change in changes for arg in ("--param", change)]
    result = llmft("run", *_DRY_RUN_BACKENDS[backend], *_DRY_RUN_PARAMS, *extra, "--dry-run")
    if not fragment:
        assert result.exit_code == 0, result.output
        assert "passes validation; nothing was sent" in result.output
    else:
        assert_user_error(result, fragment)
