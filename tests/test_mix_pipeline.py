"""A weighted mix through the real Beam pipeline (DirectRunner): shares by tokens, the same rows
on a rerun, every record accounted for per source, bad sources refused before Beam starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def _argv(data: Path, tok: Path, out: Path, mix: str, window: str = "train.jsonl") -> list[str]:
    return [
        f"--input={data / window}",
        f"--output={out}",
        f"--tokenizer={tok}",
        "--seq-len=256",
        f"--train-data-mix={mix}",
        "--direct_num_workers=1",
    ]


def _shards(out: Path) -> list[bytes]:
    return [p.read_bytes() for p in sorted((out / "train").glob("*.parquet"))]


def test_a_two_source_mix_gets_its_token_shares_reproducibly(
    sample_data_dir: Path, tiny_model_dir: Path, tmp_path: Path
):
    from beam_preprocess.pipeline import run

    # train.jsonl (4000 records) and heldout.jsonl (400): ask for 0.8 / 0.2
    mix = f"train=0.8,{sample_data_dir / 'heldout.jsonl'}=0.2"
    manifest = run(_argv(sample_data_dir, tiny_model_dir, tmp_path / "a", mix))
    stats = manifest.stats
    sources = stats["mix"]["sources"]
    assert set(sources) == {"train", str(sample_data_dir / "heldout.jsonl")}
    small = sources[str(sample_data_dir / "heldout.jsonl")]
    train = sources["train"]
    # every record of each source accounted for; the run's totals add up too
    for entry in sources.values():
        assert entry["records_read"] == entry["accounted"] > 0
    assert stats["records_read"] == 4400 == stats["accounted"]
    not_sampled = stats["filtered_by_reason"].get("not_sampled", 0)
    assert not_sampled == train["not_sampled"] + small["not_sampled"] == 0
    # shares by tokens: the window (train) used once, the small source repeated (~2.4 passes)
    assert abs(small["share"] - 0.2) < 0.01 and abs(train["share"] - 0.8) < 0.01
    assert 2 < small["passes"] < 3 and train["passes"] == 1.0 and train["not_sampled"] == 0
    assert train["train_tokens"] + small["train_tokens"] == manifest.splits["train"].tokens
    # the eval split is drawn from each source, never repeated
    assert small["eval_tokens"] > 0 and train["eval_tokens"] > 0
    assert small["eval_tokens"] + train["eval_tokens"] == manifest.splits["eval"].tokens
    # the same inputs give the same rows
    again = run(_argv(sample_data_dir, tiny_model_dir, tmp_path / "b", mix))
    assert again.stats["mix"] == stats["mix"]
    assert _shards(tmp_path / "a") == _shards(tmp_path / "b")
    written = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert written["stats"]["mix"] == stats["mix"]
    # worker processes (each with its own partial histograms and buckets) decide alike
    argv = _argv(sample_data_dir, tiny_model_dir, tmp_path / "c", mix)
    argv[-1] = "--direct_num_workers=2"
    parallel = run([*argv, "--direct_running_mode=multi_processing"])
    assert parallel.stats["mix"] == stats["mix"]


def test_bad_sources_are_refused_before_beam_starts(
    sample_data_dir: Path, tiny_model_dir: Path, tmp_path: Path
):
    from beam_preprocess.pipeline import run

    out = tmp_path / "out"
    empty = f"train=0.5,{tmp_path / 'nothing' / '*.jsonl'}=0.5"
    with pytest.raises(ValueError, match="matches no files"):
        run(_argv(sample_data_dir, tiny_model_dir, out, empty))
    twice = f"train=0.5,{sample_data_dir / '*.jsonl'}=0.5"
    with pytest.raises(ValueError, match="in two sources"):
        run(_argv(sample_data_dir, tiny_model_dir, out, twice))
    with pytest.raises(ValueError, match="not a positive number"):
        run(_argv(sample_data_dir, tiny_model_dir, out, "train=0,x=1"))
    assert not out.exists()


def test_the_preprocess_step_reads_validates_mix_with_packaged_replay(
    sample_data_dir: Path, tiny_model_dir: Path, tmp_path: Path
):
    """validate's plan (replay 0.2 of the packaged general set) -> the preprocess component."""
    from types import SimpleNamespace

    from kfp.dsl import Dataset, Markdown

    from components.params.step_params import request_of
    from components.schedules.plan import plan_run
    from components.schedules.replay import GENERAL_PATH
    from components.steps.preprocess import COMPONENT as PREPROCESS_STEP
    from components.steps.preprocess import run

    train = str(sample_data_dir / "train.jsonl")
    params = SimpleNamespace(
        work_uri=str(tmp_path / "work"),
        train_data_uri=train,
        registered_model="",
        register_model=False,
        project="",
        region="us-central1",
        replay_fraction=0.2,
        replay_source="general",
        train_data_mix="",
        min_new_records=0,
    )
    plan, problems = plan_run(params, train, "run-1", "", lambda _uri: [])
    assert problems == [] and plan.proceed
    dataset = Dataset(uri=str(tmp_path / "dataset"))
    summary = tmp_path / "summary.md"
    request = request_of(
        PREPROCESS_STEP,
        train_data_uri=train,
        train_data_mix=plan.train_data_mix,
        base_model=str(tiny_model_dir),
        seq_len=256,
        work_uri=str(tmp_path),
        run_id="run-1",
        dataflow_options={"direct_num_workers": 1},
        dataset=dataset,
        summary=Markdown(uri=str(summary)),
        gcp_resources=str(tmp_path / "gcp_resources"),
    )
    run(request)
    manifest = json.loads((tmp_path / "dataset" / "manifest.json").read_text())
    sources = manifest["stats"]["mix"]["sources"]
    replay = sources[str(GENERAL_PATH)]
    assert replay["replay"] and not sources["train"]["replay"]
    assert abs(replay["share"] - 0.2) < 0.02, replay
    lines = len(GENERAL_PATH.read_text().splitlines())
    assert replay["records_read"] == replay["accounted"] == lines
    assert "| source | replay |" in summary.read_text()


def test_parquet_and_json_array_sources_are_counted_per_source(
    sample_data_dir: Path, tiny_model_dir: Path, tmp_path: Path
):
    """Records named "path#row" (Parquet) and "path[i]" (JSON arrays) find their source too."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from beam_preprocess.pipeline import run

    held = [
        json.loads(line) for line in (sample_data_dir / "heldout.jsonl").read_text().splitlines()
    ]
    pq.write_table(pa.Table.from_pylist(held[:200]), tmp_path / "a.parquet")
    (tmp_path / "b.json").write_text(json.dumps(held[200:]))
    mix = f"train=0.9,{tmp_path / 'a.parquet'}=0.05,{tmp_path / 'b.json'}=0.05"
    manifest = run(_argv(sample_data_dir, tiny_model_dir, tmp_path / "out", mix))
    sources = manifest.stats["mix"]["sources"]
    assert sources[str(tmp_path / "a.parquet")]["records_read"] == 200
    assert sources[str(tmp_path / "b.json")]["records_read"] == len(held) - 200
    for entry in sources.values():
        assert entry["records_read"] == entry["accounted"]
        assert abs(entry["share"] - entry["target_share"]) < 0.02, sources


def test_a_larger_extra_source_is_sampled_down_to_its_share(
    sample_data_dir: Path, tiny_model_dir: Path, tmp_path: Path
):
    """The window (400 records) at 0.5 and a 10x larger source at 0.5: the larger one is
    sampled without replacement to the window's size; what it did not draw is counted."""
    from beam_preprocess.pipeline import run

    big = str(sample_data_dir / "train.jsonl")
    mix = f"train=0.5,{big}=0.5"
    manifest = run(_argv(sample_data_dir, tiny_model_dir, tmp_path / "out", mix, "heldout.jsonl"))
    sources = manifest.stats["mix"]["sources"]
    extra = sources[big]
    assert extra["passes"] < 0.2 and 3000 < extra["not_sampled"] < 4000
    assert extra["records_read"] == extra["accounted"] == 4000
    assert abs(extra["share"] - 0.5) < 0.02 and sources["train"]["not_sampled"] == 0
    assert manifest.stats["filtered_by_reason"]["not_sampled"] == extra["not_sampled"]


def test_a_preference_mix_samples_pairs_by_tokens(
    sample_data_dir: Path, tiny_model_dir: Path, tmp_path: Path
):
    """data_kind=preference: pairs sampled by their tokens (chosen + rejected) with the same
    rule, every pair of each source accounted for."""
    from test_preference_beam import good_records

    from beam_preprocess.pipeline import run
    from trainer.packed_data.reader import read_split

    records = good_records(sample_data_dir, 200)
    window, other = tmp_path / "window.jsonl", tmp_path / "other.jsonl"
    window.write_text("".join(json.dumps(r) + "\n" for r in records[:150]))
    other.write_text("".join(json.dumps(r) + "\n" for r in records[150:]))
    argv = _argv(
        tmp_path, tiny_model_dir, tmp_path / "out", f"train=0.6,{other}=0.4", "window.jsonl"
    )
    manifest = run([*argv, "--data-kind=preference"])
    sources = manifest.stats["mix"]["sources"]
    small, train = sources[str(other)], sources["train"]
    for entry in sources.values():
        assert entry["records_read"] == entry["accounted"] == entry["kept"] + entry["not_sampled"]
    assert manifest.stats["records_read"] == 200 == manifest.stats["accounted"]
    # 50 pairs asked for 0.4 of the tokens beside 150 at 0.6: about 2 passes of the small one
    assert abs(small["share"] - 0.4) < 0.02 and abs(train["share"] - 0.6) < 0.02
    assert 1.5 < small["passes"] < 2.5 and train["passes"] == 1.0
    assert train["train_tokens"] + small["train_tokens"] == manifest.splits["train"].tokens
    rows = read_split(str(tmp_path / "out"), manifest, "train")
    assert len(rows) == manifest.splits["train"].rows > 0 and rows.pair_ids is not None
