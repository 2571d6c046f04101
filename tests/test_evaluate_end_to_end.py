"""`evaluate` on the tiny model: a brief real fine-tune must show up as a better model.

One module-scoped fine-tune (a plain AdamW loop over packed rows, see tests/eval_fixtures.py) and
one full evaluation (base local, tuned local, champion on fsspec's memory:// filesystem standing in
for gs://) feed the tests; the report is opened in headless Chromium. Input errors are checked on
tiny directories that hold no weights: they must be refused before any model loads.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import fsspec
import pytest
from chromium import CHROMIUM, run_chromium
from eval_fixtures import build_eval_dataset, finetune_briefly, one_torch_thread

from components.evaluation.evaluate import run_evaluation
from components.evaluation.gate import GateThresholds
from components.evaluation.outputs import EvaluationResult
from components.evaluation.request import EvaluationRequest

SEQ_LEN = 256
FINETUNE_STEPS = 40
MEMORY_CHAMPION = "memory://llmft-eval-test/champion"


@dataclass
class Env:
    base: Path
    tuned: Path
    data: Path
    train_metrics: Path
    losses: list[float]


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def dataset(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, sample_data_dir: Path
) -> Path:
    """Packed train/eval splits of the sample data plus eval_records/ (no Beam needed)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    return build_eval_dataset(
        tmp_path_factory.mktemp("evaluate_data"), tokenizer, sample_data_dir,
        n_train=600, n_eval=48, seq_len=SEQ_LEN,
    )  # fmt: skip


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, dataset: Path) -> Env:
    """The tiny model fine-tuned briefly on the train split."""
    data = dataset
    tuned = tmp_path_factory.mktemp("evaluate") / "tuned"
    losses = finetune_briefly(
        tiny_model_dir, data, tuned, steps=FINETUNE_STEPS, batch_size=4, lr=3e-3
    )
    return Env(tiny_model_dir, tuned, data, tuned / "metrics.jsonl", losses)


@pytest.fixture(scope="module")
def evaluation(env: Env, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EvaluationResult]:
    fs = fsspec.filesystem("memory")
    fs.put(str(env.base) + "/", "/llmft-eval-test/champion/", recursive=True)
    try:
        yield run_evaluation(
            EvaluationRequest(
                base=str(env.base),
                tuned=str(env.tuned),
                champion=MEMORY_CHAMPION,
                data_dir=str(env.data),
                output_dir=str(tmp_path_factory.mktemp("evaluate_out")),
                max_examples=16,
                max_new_tokens=16,
                num_samples=5,
                train_metrics=str(env.train_metrics),
                thresholds=GateThresholds(min_loss_improvement=1.0),
            )
        )
    finally:
        fs.rm("/llmft-eval-test", recursive=True)


@pytest.mark.slow
def test_finetuned_model_beats_base(env: Env, evaluation: EvaluationResult) -> None:
    m = evaluation.metrics
    # Untrained, the model is near uniform over its 4k vocabulary (ln 4096 = 8.3 nats).
    assert 7.5 < m["base_eval_loss"] < 9.0
    assert m["tuned_eval_loss"] < m["base_eval_loss"] - 1.0, m
    assert m["eval_loss_delta"] == pytest.approx(m["tuned_eval_loss"] - m["base_eval_loss"])
    assert m["tuned_perplexity"] < m["base_perplexity"]
    # The champion is a copy of the base model read through fsspec: identical numbers.
    assert m["champion_eval_loss"] == pytest.approx(m["base_eval_loss"], rel=1e-6)
    assert m["champion_exact_match"] == m["base_exact_match"]
    # chrF is not asserted to improve: after 40 steps the base model's long digit salad can
    # share as many characters with numeric answers as the tuned model's short wrong ones.
    assert 0.0 <= m["tuned_chrf"] <= 100.0
    assert 0.0 <= m["tuned_exact_match"] <= 1.0
    assert m["generation_examples"] == 16
    assert m["eval_rows"] >= 2 and m["eval_target_tokens"] > 100
    assert evaluation.passed, evaluation.decision.failures
    assert {c["name"] for c in evaluation.decision.checks} == {
        "loss_improvement",
        "champion_loss",
        "champion_exact_match",
    }

    saved = json.loads(Path(evaluation.metrics_path).read_text())
    assert saved["passed"] is True
    assert saved["metrics"]["tuned_eval_loss"] == pytest.approx(m["tuned_eval_loss"])
    assert saved["models"]["champion"] == MEMORY_CHAMPION
    assert saved["settings"]["thresholds"]["min_loss_improvement"] == 1.0
    generations = [
        json.loads(line) for line in Path(evaluation.generations_path).read_text().splitlines()
    ]
    assert len(generations) == 16
    heldout = [
        json.loads(line)
        for line in (env.data / "eval_records/part-00000.jsonl").read_text().splitlines()
    ]
    assert [g["prompt"] for g in generations] == [r["prompt"] for r in heldout[:16]]
    assert [g["reference"] for g in generations] == [r["response"] for r in heldout[:16]]
    assert evaluation.samples == generations[:5]


@pytest.mark.slow
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium")
def test_report_renders_in_headless_chromium(evaluation: EvaluationResult, tmp_path: Path) -> None:
    import numpy as np
    from matplotlib.image import imread

    report = Path(evaluation.report_path)
    url = report.as_uri()
    dom = run_chromium(["--dump-dom", url], tmp_path / "profile-dom")
    assert "Quality gate: PASSED" in dom
    for metric in ("eval_loss", "perplexity", "exact_match", "chrf"):
        assert f'<tr data-metric="{metric}">' in dom
    assert "<th>Champion</th>" in dom
    assert '<img id="loss-curve" alt="training loss curve" src="data:image/png;base64,' in dom
    samples = dom.split('<table id="samples">', 1)[1].split("</table>", 1)[0]
    assert samples.count("<tr>") == 1 + 5  # header + num_samples
    assert evaluation.samples[0]["prompt"].replace("'", "&#x27;").split()[0] in samples

    shot = tmp_path / "report.png"
    run_chromium(
        [f"--screenshot={shot}", "--window-size=1200,1400", "--hide-scrollbars", url],
        tmp_path / "profile-shot",
    )
    assert shot.exists(), "chromium wrote no screenshot"
    if os.environ.get("LLMFT_KEEP_SCREENSHOT"):
        shutil.copy(shot, os.environ["LLMFT_KEEP_SCREENSHOT"])
    pixels = imread(str(shot))[..., :3]
    # The plot's line is matplotlib's default blue (#1f77b4): it is only on screen when the
    # embedded PNG was decoded and drawn.
    blue = np.array([0x1F, 0x77, 0xB4]) / 255
    line_pixels = int((np.abs(pixels - blue).max(axis=-1) < 0.08).sum())
    assert line_pixels > 200, f"only {line_pixels} plot-line pixels in the screenshot"
    # The metrics table's green "better" deltas are drawn too.
    green = np.array([0x0A, 0x7A, 0x2F]) / 255
    assert int((np.abs(pixels - green).max(axis=-1) < 0.1).sum()) > 20


@pytest.mark.slow
def test_cli_loss_only_gate_failure_exits_1(env: Env, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from pipelines.cli import app

    out = tmp_path / "cli_out"
    args = [
        "evaluate", "--base", str(env.base), "--tuned", str(env.tuned), "--data", str(env.data),
        "--output", str(out), "--max-examples", "0", "--max-eval-rows", "2",
        "--min-loss-improvement", "50", "--require-pass",
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["passed"] is False
    assert saved["metrics"]["eval_rows"] == 2
    assert saved["metrics"]["generation_examples"] == 0
    assert "tuned_exact_match" not in saved["metrics"]
    assert "required >= 50.0000" in saved["checks"][0]["detail"]
    assert (out / "report.html").exists()


@pytest.mark.slow
def test_forgetting_check_scores_the_general_probes(env: Env, tmp_path: Path) -> None:
    """The probes are asked of both models; a base that answers none leaves nothing to retain."""
    from components.evaluation.general_probes import load_probes

    result = run_evaluation(EvaluationRequest(
        base=str(env.base), tuned=str(env.tuned), data_dir=str(env.data),
        output_dir=str(tmp_path / "out"), max_examples=0, max_eval_rows=2,
        thresholds=GateThresholds(min_general_retained=0.5),
    ))  # fmt: skip
    assert result.metrics["base_general_correct"] == 0.0  # a tiny model trained from scratch
    assert "tuned_general_correct" in result.metrics and "general_retained" not in result.metrics
    check = next(c for c in result.decision.checks if c["name"] == "general_retained")
    assert check["passed"] and "nothing to retain" in check["detail"]
    lines = Path(result.generations_path).read_text().splitlines()
    probes = [json.loads(line) for line in lines]
    assert [p["probe"] for p in probes] == [p.question for p in load_probes()]
    assert {"base", "tuned", "base_match", "tuned_match"} <= set(probes[0])


def _weightless_copy(model_dir: Path, out: Path) -> Path:
    """config + tokenizer files only: enough for every check that must run before weights load."""
    out.mkdir(parents=True)
    for f in model_dir.iterdir():
        if not f.name.endswith(".safetensors"):
            shutil.copy(f, out / f.name)
    return out


def test_missing_model_paths_are_reported_together(
    tiny_model_dir: Path, dataset: Path, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from pipelines.cli import app

    result = CliRunner().invoke(
        app,
        [
            "evaluate", "--base", str(tmp_path / "nope"), "--tuned", str(tmp_path),
            "--data", str(dataset), "--output", str(tmp_path / "out"),
        ],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "base model path" in result.output and "does not exist" in result.output
    assert "has no config.json" in result.output
    assert "Traceback" not in result.output


def test_empty_eval_split_is_refused(tiny_model_dir: Path, dataset: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(dataset, data)
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["splits"]["eval"] = {
        "rows": 0,
        "documents": 0,
        "tokens": 0,
        "target_tokens": 0,
        "shards": [],
    }
    (data / "manifest.json").write_text(json.dumps(manifest))
    shutil.rmtree(data / "eval")
    with pytest.raises(ValueError, match=r"the eval split of .* is empty"):
        run_evaluation(EvaluationRequest(
            base=str(tiny_model_dir), tuned=str(tiny_model_dir), data_dir=str(data),
            output_dir=str(tmp_path / "out"), max_examples=4,
        ))  # fmt: skip
    assert not (tmp_path / "out").exists()


def test_tokenizer_mismatch_is_refused_before_loading(
    tiny_model_dir: Path, dataset: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    other = _weightless_copy(tiny_model_dir, tmp_path / "other")
    tokenizer = AutoTokenizer.from_pretrained(other)
    tokenizer.add_tokens(["<|tool|>"], special_tokens=True)
    tokenizer.save_pretrained(other)
    # Unreadable weights in `other`: reaching from_pretrained would fail differently.
    (other / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(ValueError) as info:
        run_evaluation(EvaluationRequest(
            base=str(tiny_model_dir), tuned=str(other), data_dir=str(dataset),
            output_dir=str(tmp_path / "out"), max_examples=4,
        ))  # fmt: skip
    text = str(info.value)
    assert text.startswith(f"tuned model {str(other)!r} cannot be evaluated on this dataset")
    assert "tokenizer mismatch on vocab_size" in text and "fingerprint" in text
    assert "preprocess with the model's tokenizer" in text


def test_bad_options_are_reported_together(
    tiny_model_dir: Path, dataset: Path, tmp_path: Path
) -> None:
    with pytest.raises(ValueError) as info:
        run_evaluation(EvaluationRequest(
            base=str(tiny_model_dir), tuned=str(tiny_model_dir), data_dir=str(dataset),
            output_dir=str(tmp_path / "out"), max_examples=-1, batch_size=0,
            heldout=str(tmp_path / "missing.jsonl"),
            thresholds=GateThresholds(min_exact_match=2.0),
        ))  # fmt: skip
    text = str(info.value)
    for fragment in (
        "max_examples must be >= 0",
        "batch_size must be >= 1",
        "missing.jsonl",
        "min_exact_match",
    ):
        assert fragment in text


@pytest.mark.slow
def test_packed_scoring_does_not_leak_across_documents(env: Env) -> None:
    """Two documents packed in one row score exactly as when each has a row of its own."""
    import numpy as np
    import torch
    from packed_fixtures import read_jsonl, tokenize_record
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from components.evaluation.scoring import score_rows
    from trainer.packed_data.reader import PackedRows

    tokenizer = AutoTokenizer.from_pretrained(env.tuned)
    model = AutoModelForCausalLM.from_pretrained(env.tuned, dtype=torch.float32).eval()
    records = read_jsonl(env.data / "eval_records/part-00000.jsonl", 2)
    docs = [tokenize_record(tokenizer, r) for r in records]
    length, pad = 64, tokenizer.pad_token_id

    def row(
        parts: list[tuple[list[int], list[int]]], positions: str = "restart"
    ) -> tuple[list[int], ...]:
        ids = [t for d, _ in parts for t in d]
        mask = [m for _, dm in parts for m in [0, *dm[1:]]]
        pos = [p for d, _ in parts for p in range(len(d))]
        if positions == "continuous":
            pos = list(range(len(ids)))
        free = length - len(ids)
        return ids + [pad] * free, mask + [0] * free, pos + list(range(free))

    def rows(*built: tuple[list[int], ...]) -> PackedRows:
        return PackedRows(*(np.array(col, np.int32) for col in zip(*built, strict=True)))

    device = torch.device("cpu")
    separate = score_rows(model, rows(row(docs[:1]), row(docs[1:])), device=device)
    packed = score_rows(model, rows(row(docs)), device=device)
    leaky = score_rows(model, rows(row(docs, positions="continuous")), device=device)
    assert packed.target_tokens == separate.target_tokens > 0
    assert packed.loss == pytest.approx(separate.loss, abs=1e-4)
    # Sanity check of the check: positions that do not restart make the second document attend
    # to the first, and the score changes.
    assert abs(leaky.loss - separate.loss) > 1e-3


@pytest.mark.slow
def test_batched_left_padded_generation_matches_one_by_one(env: Env) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from components.evaluation import data as data_io
    from components.evaluation.generation import generate_answers

    tokenizer = AutoTokenizer.from_pretrained(env.tuned)
    model = AutoModelForCausalLM.from_pretrained(env.tuned, dtype=torch.float32).eval()
    examples = data_io.read_examples([str(env.data / "eval_records/part-00000.jsonl")], 6)
    assert len({len(e.prompt_text) for e in examples}) > 1, "prompts of different lengths needed"
    device = torch.device("cpu")
    batched = generate_answers(
        model, tokenizer, examples, device=device, batch_size=6, max_new_tokens=8
    )
    single = generate_answers(
        model, tokenizer, examples, device=device, batch_size=1, max_new_tokens=8
    )
    assert batched == single
    assert tokenizer.padding_side == "right", "generation must restore the tokenizer's padding side"
    assert all("<|end|>" not in a and "<|pad|>" not in a for a in batched)


@pytest.mark.slow
def test_kfp_component_entry_point(env: Env, tmp_path: Path) -> None:
    """What the `evaluate` component calls: the Model artifact (the exported model only) and its
    run directory in metadata in, report file + scalars out."""
    from kfp.dsl import HTML, Dataset, Metrics, Model

    from components.params.step_params import request_of
    from components.steps.evaluate import COMPONENT as EVALUATE_STEP
    from components.steps.evaluate import run

    run_dir, model = tmp_path / "train-run", tmp_path / "model"
    shutil.copytree(env.tuned, model)
    run_dir.mkdir()
    shutil.copy(env.train_metrics, run_dir / "metrics.jsonl")
    report = tmp_path / "report.html"
    metrics = Metrics(uri=str(tmp_path / "metrics"))
    (passed,) = run(
        request_of(
            EVALUATE_STEP,
            base_model=str(env.base),
            tuned_model=Model(uri=str(model), metadata={"run_uri": str(run_dir)}),
            dataset=Dataset(uri=str(env.data)),
            max_eval_examples=0,
            min_loss_improvement=0.5,
            min_exact_match=0.0,
            champion_model="",
            min_general_retained=0.0,
            project="",
            hf_token_secret="",
            metrics=metrics,
            report=HTML(uri=str(report)),
        )
    )
    scalars = metrics.metadata
    assert passed is True and scalars["passed"] == 1.0
    assert scalars["tuned_eval_loss"] < scalars["base_eval_loss"] - 0.5
    assert all(isinstance(v, float) for v in scalars.values())
    page = report.read_text()
    assert 'src="data:image/png;base64,' in page  # the curve came from <run dir>/metrics.jsonl


@pytest.mark.slow
def test_reads_a_dataset_written_by_the_beam_pipeline(
    tiny_model_dir: Path, sample_data_dir: Path, tmp_path: Path
) -> None:
    """The contract end to end: real preprocessing output (packed eval split + eval_records)."""
    from beam_preprocess.pipeline import run

    source = tmp_path / "records.jsonl"
    lines = (sample_data_dir / "train.jsonl").read_text().splitlines(keepends=True)
    source.write_text("".join(lines[:300]))
    manifest = run(
        [
            "--input", str(source), "--output", str(tmp_path / "dataset"),
            "--tokenizer", str(tiny_model_dir), "--seq-len", "256", "--data-kind", "instruction",
            "--eval-fraction", "0.2", "--direct_num_workers", "1",
        ]
    )  # fmt: skip
    assert manifest.eval_records, "preprocessing listed no eval_records"
    result = run_evaluation(EvaluationRequest(
        base=str(tiny_model_dir), tuned=str(tiny_model_dir), data_dir=str(tmp_path / "dataset"),
        output_dir=str(tmp_path / "out"), max_examples=4, max_new_tokens=4,
    ))  # fmt: skip
    m = result.metrics
    assert m["eval_rows"] == manifest.splits["eval"].rows
    assert m["eval_target_tokens"] == manifest.splits["eval"].target_tokens
    assert m["generation_examples"] == 4
    assert m["eval_loss_delta"] == 0.0  # the same weights, the same rows
    eval_records = [
        json.loads(line)
        for rel in manifest.eval_records
        for line in (tmp_path / "dataset" / rel).read_text().splitlines()
    ]
    assert [s["reference"] for s in result.samples] == [r["response"] for r in eval_records[:4]]
