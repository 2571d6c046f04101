"""The whole preprocessing pipeline: DirectRunner runs on the sample and dirty data, the CLI, the
component runtime, and the Dataflow path checked offline (options and the job request Beam builds).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest


def _identity(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    from trainer.packed_data.format import TokenizerIdentity

    return TokenizerIdentity.of(AutoTokenizer.from_pretrained(tiny_model_dir))


def _rows(dataset: Path, shards: list[str]):
    import pyarrow as pa
    import pyarrow.parquet as pq

    return pa.concat_tables([pq.read_table(dataset / s) for s in shards])


@pytest.mark.slow
def test_component_runs_sample_data_to_a_dataset_the_trainer_accepts(
    sample_data_dir: Path, tiny_model_dir: Path, tmp_path: Path
):
    import numpy as np
    from kfp.dsl import Dataset, Markdown

    from components.params.step_params import request_of
    from components.steps.preprocess import COMPONENT as PREPROCESS_STEP
    from components.steps.preprocess import run
    from trainer.packed_data.format import COLUMNS, compatibility_errors, read_manifest

    out = tmp_path / "dataset"
    summary, gcp_resources = tmp_path / "summary.md", tmp_path / "gcp_resources"
    dataset = Dataset(uri=str(out))
    request = request_of(
        PREPROCESS_STEP,
        train_data_uri=str(sample_data_dir / "train.jsonl"),
        base_model=str(tiny_model_dir),
        data_kind="instruction",
        seq_len=512,
        eval_fraction=0.1,
        preprocess_runner="DirectRunner",
        project="",
        region="",
        work_uri=str(tmp_path),
        run_id="run-1",
        # Dataflow-only settings are ignored locally; one worker keeps the run in-process
        # (the multi-process engine is exercised by the benchmark).
        dataflow_options={"max_num_workers": 20, "direct_num_workers": 1},
        dataflow_service_account="",
        hf_token_secret="",
        dataset=dataset,
        summary=Markdown(uri=str(summary)),
        gcp_resources=str(gcp_resources),
    )
    run(request)
    meta = dataset.metadata
    assert not list(out.glob(".shuffle-*"))  # the local run's spilled shuffle is gone
    assert json.loads(gcp_resources.read_text()) == {"resources": []}
    manifest = read_manifest(str(out))
    assert compatibility_errors(manifest, _identity(tiny_model_dir), 512) == []
    assert compatibility_errors(
        manifest, _identity(tiny_model_dir), 256
    )  # seq_len mismatch refused
    stats = manifest.stats
    assert stats["records_read"] == stats["kept"] == 4000
    # The tiny model's generation prompt ends in a special token: no boundary token to split.
    assert stats["answer_boundary_retokenized"] == 0 and stats["answer_boundary_sources"] == []
    assert meta["rows"] == sum(s.rows for s in manifest.splits.values())
    assert meta["fill_ratio"] >= 0.98  # whole documents only, yet rows are nearly full
    train = manifest.splits["train"]
    assert train.tokens / (train.rows * 512) >= 0.99
    assert "| kept | 4,000 |" in summary.read_text()
    for _name, info in manifest.splits.items():
        table = _rows(out, info.shards)
        assert table.column_names == list(COLUMNS)
        ids = np.array(table.column("input_ids").to_pylist())
        mask = np.array(table.column("loss_mask").to_pylist())
        pos = np.array(table.column("position_ids").to_pylist())
        assert ids.shape == (info.rows, 512)
        assert (
            int((pos == 0).sum() - (ids[:, -1] == manifest.tokenizer.pad_token_id).sum())
            == info.documents
        )
        assert int(mask.sum()) == info.target_tokens
    assert 300 < manifest.splits["eval"].documents < 500
    # The evaluator's records are exactly the eval split's documents.
    eval_lines = [
        json.loads(line)
        for path in manifest.eval_records
        for line in (out / path).read_text().splitlines()
    ]
    assert len(eval_lines) == manifest.splits["eval"].documents
    train_prompts = {
        json.loads(x)["prompt"] for x in (sample_data_dir / "train.jsonl").read_text().splitlines()
    }
    assert {r["prompt"] for r in eval_lines} <= train_prompts


@pytest.mark.slow
def test_dirty_data_every_injected_record_is_accounted_for(
    sample_data_dir: Path, tiny_model_dir: Path, tmp_path: Path
):
    from beam_preprocess.options import PreprocessConfig
    from beam_preprocess.pipeline import run, write_manifest
    from trainer.packed_data.format import STATS_FILE

    report = json.loads((sample_data_dir / "dirty_report.json").read_text())
    out = tmp_path / "dirty"
    argv = [
        f"--input={sample_data_dir}/dirty.jsonl",
        f"--output={out}",
        f"--tokenizer={tiny_model_dir}",
        "--seq-len=512",
        "--direct_num_workers=1",
        "--max-rejected-fraction=0.01",  # the dirty data has ~3% bad records: must fail
    ]
    with pytest.raises(ValueError, match=r"were rejected .* above --max-rejected-fraction 0.01"):
        run(argv)
    assert not (out / "manifest.json").exists()
    stats = json.loads((out / STATS_FILE).read_text())
    injected = report["injected"]
    assert stats["records_read"] == report["total_lines"]
    assert stats["rejected_by_reason"] == {
        "invalid_json": injected["invalid_json"],
        "missing_field": injected["missing_field"],
        "empty_field": injected["empty_text"],
    }
    assert stats["duplicates"] == injected["duplicate"]
    assert stats["kept"] == report["clean_records"]
    # The dead letters name each injected bad record (file:line) with its reason.
    letters = [
        json.loads(line)
        for f in sorted((out / "rejected").glob("*.jsonl"))
        for line in f.read_text().splitlines()
    ]
    by_reason: dict[str, list[int]] = {}
    for letter in letters:
        assert letter["error"]
        by_reason.setdefault(letter["reason"], []).append(int(letter["source"].rsplit(":", 1)[1]))
    assert sorted(by_reason["invalid_json"]) == report["lines"]["invalid_json"]
    assert sorted(by_reason["missing_field"]) == report["lines"]["missing_field"]
    assert sorted(by_reason["empty_field"]) == report["lines"]["empty_text"]

    # With a tolerant threshold the same outputs make a valid manifest whose stats add up.
    config = PreprocessConfig(
        inputs=("x",), output=str(out), tokenizer=str(tiny_model_dir), seq_len=512
    )
    manifest = write_manifest(replace(config, max_rejected_fraction=0.1), _identity(tiny_model_dir))
    s = manifest.stats
    assert s["records_read"] == s["kept"] + s["filtered"] + s["duplicates"] + s["rejected"]


def test_manifest_reports_documents_retokenized_at_the_answer_boundary(
    sample_data_dir: Path, tiny_model_dir: Path, tmp_path: Path
):
    from test_beam_transforms import trailing_space_tokenizer

    from beam_preprocess.pipeline import run
    from beam_preprocess.tokenize import load_tokenizer

    tokenizer_dir = trailing_space_tokenizer(tiny_model_dir, tmp_path / "tok")
    lines = (sample_data_dir / "train.jsonl").read_text().splitlines()[:60]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    manifest = run(
        [f"--input={tmp_path}/in.jsonl", f"--output={tmp_path}/out", f"--tokenizer={tokenizer_dir}",
         "--seq-len=256", "--direct_num_workers=1"]
    )  # fmt: skip
    # Expected: the records whose rendered text has a token across the end of the prompt.
    tok = load_tokenizer(str(tokenizer_dir))

    def straddles(record: dict) -> bool:
        user = [{"role": "user", "content": record["prompt"]}]
        head = tok.apply_chat_template(user, add_generation_prompt=True, tokenize=False)
        answer = {"role": "assistant", "content": record["response"]}
        full = tok.apply_chat_template([*user, answer], tokenize=False)
        offsets = tok(full, add_special_tokens=False, return_offsets_mapping=True).offset_mapping
        return any(start < len(head) < end for start, end in offsets)

    expected = sorted(
        f"{tmp_path}/in.jsonl:{number}"
        for number, line in enumerate(lines, start=1)
        if straddles(json.loads(line))
    )
    stats = manifest.stats
    assert stats["answer_boundary_retokenized"] == len(expected) > 0
    assert stats["answer_boundary_sources"] == expected[:20]
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["stats"] == stats


def test_cli_help_and_user_errors(tmp_path: Path):
    from typer.testing import CliRunner

    from pipelines.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["preprocess", "--help"])
    assert result.exit_code == 0
    assert "--seq-len" in result.output and "--max-rejected-fraction" in result.output
    result = runner.invoke(
        app, ["preprocess", "--input", str(tmp_path / "none*.jsonl"), "--output", str(tmp_path / "o"),
              "--tokenizer", "t", "--seq-len", "64"],
    )  # fmt: skip
    assert result.exit_code == 2 and "matches no files" in result.output
    result = runner.invoke(app, ["preprocess", "--input", "x", "--seq-lenn", "3"])
    assert result.exit_code == 2 and "unknown flag(s): --seq-lenn" in result.output


def test_options_report_every_mistake_at_once():
    from beam_preprocess.pipeline import parse_options

    with pytest.raises(ValueError) as info:
        parse_options(["--seq-len=4", "--eval-fraction=1.5", "--pack-groups=0"])
    message = str(info.value)
    for expected in ("--input is required", "--output is required", "--tokenizer is required",
                     "--seq-len must be", "--eval-fraction must be", "--pack-groups must be"):  # fmt: skip
        assert expected in message


DATAFLOW_ARGS = [
    "--input=gs://llmft-bucket/raw/*.jsonl",
    "--output=gs://llmft-bucket/packed",
    "--tokenizer=gs://llmft-bucket/tokenizer",
    "--seq-len=512",
    "--runner=DataflowRunner",
    "--project=llmft-project",
    "--region=us-central1",
    "--temp_location=gs://llmft-bucket/tmp",
    "--service_account_email=preprocess@llmft-project.iam.gserviceaccount.com",
    "--network=llmft-net",
    "--subnetwork=regions/us-central1/subnetworks/llmft-subnet",
    "--machine_type=n2-standard-8",
    "--max_num_workers=20",
    "--sdk_container_image=us-docker.pkg.dev/llmft-project/llmft/llmft:0.1.0",
    "--dry_run=True",  # Beam's own switch: no GCS calls while validating options
]


def test_dataflow_options_are_validated_with_clear_errors():
    from beam_preprocess.pipeline import parse_options

    bad = [
        "--input=data/*.jsonl", "--output=out", "--tokenizer=./tok", "--seq-len=512",
        "--runner=DataflowRunner", "--region=us-central1", "--temp_location=/tmp/x",
        "--subnetwork=my-subnet", "--service_account_email=someone@gmail.com",
    ]  # fmt: skip
    with pytest.raises(ValueError) as info:
        parse_options(bad)
    message = str(info.value)
    for expected in ("--project is required", "--temp_location must be a gs:// path",
                     "--subnetwork 'my-subnet' must be", "is not a service account",
                     "workers need this package", "--input 'data/*.jsonl' must be a gs:// path",
                     "--output 'out' must be", "--tokenizer './tok' is a local path"):  # fmt: skip
        assert expected in message


def test_dataflow_job_request_is_built_offline():
    import apache_beam as beam

    from beam_preprocess.dataflow import build_job_request
    from beam_preprocess.graph import build_pipeline
    from beam_preprocess.pipeline import parse_options

    options, config = parse_options(DATAFLOW_ARGS)
    pipeline = beam.Pipeline(options=options)
    build_pipeline(pipeline, config, pad_id=0)
    job, environment = build_job_request(pipeline, options)
    assert job.proto.type_.name == "JOB_TYPE_BATCH"
    env = environment.proto
    assert env.service_account_email == "preprocess@llmft-project.iam.gserviceaccount.com"
    pool = env.worker_pools[0]
    assert pool.machine_type == "n2-standard-8"
    assert pool.network == "llmft-net"
    assert pool.subnetwork == "regions/us-central1/subnetworks/llmft-subnet"
    assert pool.autoscaling_settings.max_num_workers == 20
    assert pool.sdk_harness_container_images[0].container_image.endswith("llmft:0.1.0")
    # The named steps of the graph are in the pipeline proto that would be submitted.
    names = {t.unique_name for t in environment._proto_pipeline.components.transforms.values()}
    for step in (
        "Read",
        "Prepare",
        "Tokenize",
        "DeduplicateAndPack",
        "WriteTrain",
        "WriteDeadOfRead",
        "CommitShards",
        "Stats",
    ):
        assert step in names


def test_component_writes_gcp_resources_for_the_dataflow_job(tmp_path: Path, monkeypatch, golden):
    """Submission is the cloud boundary: a fake result stands in for DataflowPipelineResult."""
    from fakes.dataflow import FakeDataflowResult

    import beam_preprocess.pipeline as pipeline_module
    from components.steps.preprocess import build_argv, run_beam
    from trainer.packed_data.format import Manifest, SplitInfo, TokenizerIdentity

    seen = {}

    def fake_launch(argv):
        options, config = pipeline_module.parse_options(argv)  # the real validation
        seen["argv"], seen["options"] = argv, options.get_all_options(drop_default=True)
        identity = TokenizerIdentity("tok", 10, 1, 0, None, "f")
        return pipeline_module.LaunchedRun(FakeDataflowResult(), config, identity, "DataflowRunner")

    def fake_finish(launched):
        stats = {"records_read": 1, "kept": 1, "filtered": 0, "duplicates": 0, "rejected": 0,
                 "filtered_by_reason": {}, "rejected_by_reason": {}}  # fmt: skip
        return Manifest(
            512, launched.tokenizer, "instruction", {"train": SplitInfo(1, 1, 500, 400)}, stats
        )

    monkeypatch.setattr(pipeline_module, "launch", fake_launch)
    monkeypatch.setattr(pipeline_module, "finish", fake_finish)
    path = tmp_path / "outputs" / "gcp_resources"
    argv = build_argv(
        input_uri="gs://llmft-bucket/raw/*.jsonl", output_uri="gs://llmft-bucket/packed",
        tokenizer="gs://llmft-bucket/tokenizer", seq_len=512, runner="DataflowRunner",
        beam_options={"project": "llmft-project", "region": "us-central1",
                      "temp_location": "gs://llmft-bucket/tmp",
                      "sdk_container_image": "us-docker.pkg.dev/llmft-project/llmft/llmft:0.1.0"},
        extra_args=["--dry_run=True"],
    )  # fmt: skip
    result = run_beam(argv, gcp_resources_path=str(path))
    resources = json.loads(path.read_text())
    assert resources == {
        "resources": [
            {
                "resourceType": "DataflowJob",
                "resourceUri": "https://dataflow.googleapis.com/v1b3/projects/llmft-project/"
                "locations/us-central1/jobs/2026-12-02_10_00_00-123",
            }
        ]
    }
    assert result["metadata"]["rows"] == 1
    # What Dataflow is asked to run: the pipeline's argv and the options Beam parsed from it.
    golden.check(
        "dataflow_pipeline_options.json", {"argv": seen["argv"], "options": seen["options"]}
    )


def test_beam_side_never_imports_torch_or_trainer():
    """Dataflow workers stay light: the pipeline modules import neither torch nor the trainer,
    only the trainer's neutral modules (the dataset format, storage and the output's lock)."""
    import subprocess
    import sys

    code = (
        "import sys, beam_preprocess.pipeline, beam_preprocess.record_steps, beam_preprocess.token_steps, beam_preprocess.cli; "
        "neutral = ('trainer', 'trainer.storage', 'trainer.packed_data.output_lock', 'trainer.packed_data'); "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'components', 'pipelines') "
        "or m.split('.')[0] == 'trainer' and '.'.join(m.split('.')[:2]) not in neutral]; "
        "assert not bad, bad; assert 'trainer.packed_data.format' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_overwrite_deletes_only_what_the_previous_run_listed(tmp_path: Path):
    from beam_preprocess.output_dir import prepare_output
    from trainer.packed_data.format import Manifest, SplitInfo, TokenizerIdentity

    precious = tmp_path / "home"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    (precious / "stats.json").write_text("{}")  # our file name is no proof of ownership
    with pytest.raises(ValueError, match="not empty"):
        prepare_output(str(precious), overwrite=False)
    with pytest.raises(ValueError, match="will not delete it"):
        prepare_output(str(precious), overwrite=True)
    assert sorted(p.name for p in precious.iterdir()) == ["notes.txt", "stats.json"]

    dataset = tmp_path / "dataset"
    written = ["stats.json", "train/part-00000.parquet", "rejected/part-00000.jsonl"]
    for rel in written:
        (dataset / rel).parent.mkdir(parents=True, exist_ok=True)
        (dataset / rel).write_text("x")
    identity = TokenizerIdentity("t", 10, 0, 0, 0, "f")
    manifest = Manifest(16, identity, "text", {"train": SplitInfo()}, {}, files=written)
    (dataset / "manifest.json").write_text(manifest.to_json())
    (dataset / "train" / "mine.txt").write_text("added by the user later")
    with pytest.raises(ValueError, match=r"train/mine.txt"):
        prepare_output(str(dataset), overwrite=True)
    assert all((dataset / rel).exists() for rel in written)
    (dataset / "train" / "mine.txt").unlink()
    prepare_output(str(dataset), overwrite=True)
    assert dataset.is_dir() and not any(dataset.iterdir())


def test_local_runs_use_worker_processes_only_for_large_inputs_on_4_cores_or_more():
    from beam_preprocess.options import LOCAL_PROCESSES_MIN_BYTES, local_workers

    large, small = LOCAL_PROCESSES_MIN_BYTES, LOCAL_PROCESSES_MIN_BYTES - 1
    assert [local_workers(large, cores) for cores in (1, 2, 3, 4, 16)] == [1, 1, 1, 4, 16]
    assert local_workers(small, 16) == 1


def test_dataflow_workers_get_a_hub_tokenizer_staged_under_temp_location(
    tiny_model_dir: Path, gcs_emulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """N5: Dataflow workers carry no HF token (and may have no internet): the launching step,
    which has the token, stages the hub tokenizer under temp_location and workers read that."""
    import beam_preprocess.tokenize as tokenize
    from components.steps.preprocess import resolve_tokenizer

    real_load = tokenize.load_tokenizer
    asked: list[str] = []

    def from_the_hub(name: str):  # the hub is out of reach here: it serves the tiny tokenizer
        asked.append(name)
        assert name == "some-org/gated-model"
        return real_load(str(tiny_model_dir))

    monkeypatch.setattr(tokenize, "load_tokenizer", from_the_hub)
    bucket = gcs_emulator.create_bucket("tokenizer-staging")
    argv = [
        "--tokenizer=some-org/gated-model",
        "--runner=DataflowRunner",
        f"--temp_location={bucket}/work/tmp",
    ]
    resolved = resolve_tokenizer(argv)
    staged = f"{bucket}/work/tmp/llmft-tokenizers/some-org--gated-model"
    assert resolved == [f"--tokenizer={staged}", *argv[1:]] and asked == [argv[0].split("=")[1]]
    # What a worker does with it: the real loader, from gs://, no hub involved.
    monkeypatch.setattr(tokenize, "load_tokenizer", real_load)
    from trainer.packed_data.format import TokenizerIdentity

    on_worker = TokenizerIdentity.of(real_load(staged))
    assert replace(on_worker, name_or_path="") == replace(
        _identity(tiny_model_dir), name_or_path=""
    )
    # In the task (DirectRunner) the step has the token: the hub id is used as it is.
    direct = ["--tokenizer=some-org/gated-model", "--runner=DirectRunner"]
    assert resolve_tokenizer(direct) == direct
    with pytest.raises(ValueError, match="temp_location gs://"):
        resolve_tokenizer(["--tokenizer=some-org/gated-model", "--runner=DataflowRunner"])
