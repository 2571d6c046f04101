"""Data from where users keep it (issue 33): a Hugging Face dataset read offline from a hub cache
the test builds, mixed with local files of several shapes, through the real Beam pipeline; and the
BigQuery read as it is built for Dataflow (no BigQuery emulator installs from PyPI here)."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHA = "0123456789abcdef0123456789abcdef01234567"


def _hub_cache(home: Path) -> None:
    """A dataset repository `acme/mixed` at tag `v1` in a Hugging Face hub cache layout (what
    `snapshot_download` leaves behind), its train split one Parquet file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    repo = home / "hub" / "datasets--acme--mixed"
    data = repo / "snapshots" / SHA / "data"
    data.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "v1").write_text(SHA)
    table = pa.table(
        {
            "prompt": ["Capital of France?", "Largest planet?", "", "Largest planet?"],
            "response": ["Paris", "Jupiter", "nothing", "Jupiter"],
            "system": ["Answer briefly.", None, None, None],
            "id": [1, 2, 3, 4],
        }
    )
    pq.write_table(table, data / "train-00000-of-00001.parquet")
    pq.write_table(table.slice(0, 1), data / "test-00000-of-00001.parquet")


def _local_files(root: Path) -> list[str]:
    def chat(*turns: tuple[str, str], **extra: object) -> dict:
        return {"messages": [{"role": r, "content": c} for r, c in turns], **extra}

    lines = [
        json.dumps(chat(("user", "Hi"), ("assistant", "Hello"), meta="greeting")),
        json.dumps({"prompt": "Colour of the sky?", "response": "Blue", "input": "daytime"}),
        json.dumps(
            {
                "messages": [
                    {"role": "user", "content": "Weather?"},
                    {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
                    {"role": "tool", "tool_call_id": "1", "content": "sunny"},
                    {"role": "assistant", "content": "Sunny."},
                ]
            }
        ),
        '{"prompt": "broken',
        json.dumps(chat(("user", "Time?"), ("function", "12:00"), ("assistant", "Noon."))),
        json.dumps({"prompt": "Colour of the sky?", "response": "Blue", "input": "night"}),
        json.dumps({"prompt": "Two plus two?", "response": "Four"}),
    ]
    (root / "mixed.jsonl").write_text("\n".join(lines) + "\n")
    (root / "mixed.csv").write_text(
        "prompt,response,lang\nOpposite of hot?,Cold,en\nOpposite of up?,Down,en\n"
    )
    return [str(root / "mixed.jsonl"), str(root / "mixed.csv")]


def _env(home: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "HF_HOME": str(home),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
    }


@pytest.mark.integration
def test_hub_dataset_and_mixed_files_every_record_accounted_for(
    tiny_model_dir: Path, tmp_path: Path
):
    home, stage = tmp_path / "hf", tmp_path / "staged"
    _hub_cache(home)
    files = _local_files(tmp_path)
    out = tmp_path / "dataset"
    argv = [
        "--input=hf://datasets/acme/mixed@v1:train",
        *(f"--input={f}" for f in files),
        f"--output={out}",
        f"--tokenizer={tiny_model_dir}",
        "--seq-len=256",
        "--eval-fraction=0",
        "--tool-turns=filter",
        "--chat-template=chatml",
        "--max-rejected-fraction=0.5",
        f"--stage-dir={stage}",
    ]
    run = subprocess.run(
        [sys.executable, "-m", "beam_preprocess", *argv],
        env=_env(home),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    stats = manifest["stats"]
    # 4 hub rows + 7 JSONL lines + 2 CSV rows, each accounted for exactly once.
    assert stats["records_read"] == 13
    assert stats["rejected_by_reason"] == {"empty_field": 1, "invalid_json": 1}
    assert stats["filtered_by_reason"] == {"tool_turns": 2}
    assert stats["duplicates"] == 2  # hub row 4 = row 2; JSONL line 6 = line 2 but for `input`
    assert stats["kept"] == 7
    assert stats["records_read"] == stats["accounted"]
    # Fields records held but their shape did not use, by the records that became examples.
    assert stats["unused_fields"] == {"id": 3, "input": 2, "lang": 2, "meta": 1}
    # Lineage: the exact commit the tag pointed at.
    ((source,),) = [manifest["sources"]]
    assert source == {
        "uri": "hf://datasets/acme/mixed@v1:train",
        "repo": "acme/mixed",
        "requested_revision": "v1",
        "revision": SHA,
        "split": "train",
        "rows": 4,
        "staged": f"{stage}/hf/acme--mixed/{SHA}/train/*.parquet",
    }
    from beam_preprocess.template_library import CHATML

    assert manifest["chat_template"] == CHATML  # the Jinja itself: trainer and evaluation use it
    # The workers rendered with the chatml template, system prompt from the hub row included.
    from transformers import AutoTokenizer

    from trainer.packed_data.format import read_manifest
    from trainer.packed_data.reader import read_shard, shard_paths

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    paths = shard_paths(str(out), read_manifest(str(out)), "train")
    text = "".join(
        tok.decode(row.tolist()) for path in paths for row in read_shard(path, 256).input_ids
    )
    assert "<|im_start|>system\nAnswer briefly.<|im_end|>\n<|im_start|>user\nCapital of " in text

    # A second staging of the same revision reuses the first: the Parquet file is untouched.
    (staged,) = (stage / "hf" / "acme--mixed" / SHA / "train").glob("*.parquet")
    before = staged.stat().st_mtime_ns
    code = (
        "import json, sys; from beam_preprocess.hf_source import stage; "
        f"print(json.dumps(stage('hf://datasets/acme/mixed@{SHA}:train', sys.argv[1])))"
    )
    again = subprocess.run(
        [sys.executable, "-c", code, str(stage)],
        env=_env(home),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert json.loads(again.stdout.splitlines()[-1])["rows"] == 4
    assert staged.stat().st_mtime_ns == before


@pytest.mark.integration
def test_a_missing_split_or_repository_is_a_clear_error(tmp_path: Path):
    home = tmp_path / "hf"
    _hub_cache(home)
    code = (
        "import sys\nfrom beam_preprocess.hf_source import stage\n"
        "try:\n    stage(sys.argv[1], sys.argv[2])\nexcept ValueError as e:\n    print(e)\n"
    )
    for uri, message in (
        ("hf://datasets/acme/mixed@v1:validation", "validation"),
        ("hf://datasets/acme/absent", "neither reachable nor in the local Hugging Face cache"),
    ):
        run = subprocess.run(
            [sys.executable, "-c", code, uri, str(tmp_path / "staged")],
            env=_env(home),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert message in run.stdout, (uri, run.stdout, run.stderr[-2000:])


@pytest.mark.integration
def test_bigquery_read_requests_match_the_reviewed_golden(
    golden, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    """Beam's BigQuery read of a bq:// input, run for real against BigQuery's REST API faked on
    loopback (tests/fakes/bigquery.py): the records come out, and every request Beam made (the
    snapshot-pinned query, the temporary dataset, the Avro export, the clean-up) equals the
    reviewed golden file tests/golden/bigquery_read.json."""
    import apache_beam as beam
    import httplib2
    from apache_beam.io.gcp import bigquery_tools
    from apache_beam.io.gcp.internal.clients import bigquery
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.testing.util import assert_that, equal_to
    from fakes.bigquery import FakeBigQuery, normalized

    from beam_preprocess import bigquery_source
    from beam_preprocess.records import READ

    uri, query = "bq://my-project.sft.pairs", "SELECT * FROM {table} WHERE response != ''"
    now = datetime.datetime(2026, 12, 4, 12, 0, 30, 500, tzinfo=datetime.UTC)
    snapshot = bigquery_source.snapshot_time(now)
    rows = [{"prompt": "2+2?", "response": "4"}, {"prompt": "Capital of Peru?", "response": "Lima"}]
    with FakeBigQuery("my-project.sft.pairs", rows) as fake:

        def client(_options: object) -> object:
            url = f"{fake.url}/bigquery/v2/"
            return bigquery.BigqueryV2(url=url, http=httplib2.Http(), get_credentials=False)

        monkeypatch.setattr(bigquery_tools.BigQueryWrapper, "_bigquery_client", client)
        flags = ["--project=my-project", f"--temp_location={tmp_path}", "--runner=FnApiRunner"]
        with beam.Pipeline(options=PipelineOptions(flags)) as p:
            read = p | bigquery_source.ReadBigQueryRecords(uri, snapshot, query)
            records = read.records | beam.Map(lambda r: r["record"])
            assert_that(records, equal_to(rows), label="records")
            assert_that(read[READ] | beam.CombineGlobally(sum), equal_to([2]), label="read")
    golden.check(
        "bigquery_read.json",
        {
            "lineage": bigquery_source.lineage(uri, snapshot, query),
            "requests": normalized(fake.requests),
        },
    )


@pytest.mark.integration  # a Beam pipeline run; BigQuery's fake on loopback
def test_bigquery_rows_become_records_with_stable_sources_and_counts():
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    from beam_preprocess.bigquery_source import RowsToRecords
    from beam_preprocess.records import DEAD, OUTCOME, READ

    rows = [
        {"prompt": "a", "response": "b", "at": datetime.date(2026, 1, 2), "score": Decimal("1.5")},
        {"prompt": "c", "response": "d", "at": None, "score": None},
    ]
    prefix = "bq://p.d.t@2026-12-04T11:59:30Z#"
    with TestPipeline() as p:
        out = (
            p
            | beam.Create(rows)
            | beam.ParDo(RowsToRecords("bq://p.d.t", "2026-12-04T11:59:30Z")).with_outputs(
                DEAD, READ, OUTCOME, main="records"
            )
        )
        records = out.records | beam.Map(lambda r: (r["source"].startswith(prefix), r["record"]))
        assert_that(
            records,
            equal_to(
                [
                    (True, {"prompt": "a", "response": "b", "at": "2026-01-02", "score": "1.5"}),
                    (True, {"prompt": "c", "response": "d", "at": None, "score": None}),
                ]
            ),
            label="records",
        )
        assert_that(out[READ] | beam.CombineGlobally(sum), equal_to([2]), label="read")


@pytest.mark.unit
def test_a_pipeline_with_a_bigquery_input_reads_it_beside_the_files(tmp_path: Path):
    """The graph Dataflow gets: files and the table read side by side, outputs flattened."""
    import apache_beam as beam

    from beam_preprocess.graph import build_pipeline, resolve_sources
    from beam_preprocess.options import PreprocessConfig

    config = PreprocessConfig(
        inputs=("gs://b/data/*.jsonl", "bq://my-project.sft.pairs"),
        output="gs://b/out",
        tokenizer="gs://b/tok",
        seq_len=256,
        bigquery_query="SELECT * FROM {table} WHERE ok",
    )
    resolved, lineage, bigquery = resolve_sources(config)
    assert resolved.inputs == ("gs://b/data/*.jsonl",)
    ((uri, snapshot),) = bigquery
    assert uri == "bq://my-project.sft.pairs"
    assert lineage[0]["sql"].endswith(f"FOR SYSTEM_TIME AS OF TIMESTAMP('{snapshot}') WHERE ok")
    pipeline = beam.Pipeline()
    build_pipeline(pipeline, resolved, pad_id=0, bigquery=bigquery)
    labels = {t.full_label for t in pipeline.transforms_stack[0].parts}
    assert {"Read", "ReadBigQuery0", "AllReadRecords", "AllReadRead"} <= labels


@pytest.mark.unit
def test_evaluation_renders_prompts_with_the_datasets_chat_template(tiny_model_dir: Path):
    """A base model preprocessed with chat_template=chatml is evaluated on chatml prompts."""
    from transformers import AutoTokenizer

    from beam_preprocess.template_library import CHATML
    from components.evaluation.prechecks import checked_tokenizers
    from trainer.packed_data.format import Manifest, SplitInfo, TokenizerIdentity

    identity = TokenizerIdentity.of(AutoTokenizer.from_pretrained(tiny_model_dir))
    manifest = Manifest(
        seq_len=256,
        tokenizer=identity,
        data_kind="instruction",
        splits={"train": SplitInfo(rows=1)},
        stats={},
        chat_template=CHATML,
    )
    roles = {"base": str(tiny_model_dir), "tuned": str(tiny_model_dir)}
    for tok in checked_tokenizers(roles, manifest).values():
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False
        )
        assert prompt == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
