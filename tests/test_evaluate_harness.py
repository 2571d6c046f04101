"""lm-evaluation-harness tasks inside the evaluator, run for real on the project's own tasks
(components/evaluation/tasks/: a log-likelihood and a generation task over a shipped JSONL file).

Our evaluator (`run_evaluation` with `HarnessSettings`: the model it loaded, wrapped in the
harness's HFLM) must report exactly the numbers a direct `lm_eval.simple_evaluate` call with the
harness's own Hugging Face loader reports, for base and tuned model alike, on the tiny model and
on SmolLM2-135M-Instruct; the numbers reach metrics.json, the report and the gate.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from eval_fixtures import build_eval_dataset, one_torch_thread

from components.evaluation.evaluate import run_evaluation
from components.evaluation.gate import GateThresholds
from components.evaluation.harness import PROJECT_TASKS_DIR, HarnessSettings, task_scores
from components.evaluation.request import EvaluationRequest
from pipelines.quickstart.smollm2 import INSTALL_HINT, smollm2_gguf

pytestmark = pytest.mark.slow
TASKS = ("llmft_facts_mc", "llmft_facts_gen")


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def tiny_data(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, sample_data_dir: Path
) -> Path:
    from transformers import AutoTokenizer

    return build_eval_dataset(
        tmp_path_factory.mktemp("harness_data"), AutoTokenizer.from_pretrained(tiny_model_dir),
        sample_data_dir, n_train=20, n_eval=4, seq_len=128,
    )  # fmt: skip


@pytest.fixture(scope="module")
def perturbed_model(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """The tiny model with seeded noise on every weight: a "tuned" model that scores differently."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("perturbed")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(out)
    return out


def direct_scores(model_dir: Path, settings: HarnessSettings) -> dict:
    """The same tasks through `lm_eval.simple_evaluate` with the harness's own model loading."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    output = lm_eval.simple_evaluate(
        model="hf",
        model_args={"pretrained": str(model_dir), "dtype": "float32", "device": "cpu"},
        tasks=list(settings.tasks),
        num_fewshot=settings.num_fewshot,
        limit=settings.limit,
        batch_size=settings.batch_size,
        task_manager=TaskManager(include_path=str(PROJECT_TASKS_DIR), include_defaults=False),
        log_samples=False,
        bootstrap_iters=0,
    )
    return task_scores(output, settings.tasks)


def evaluate(base: Path, tuned: Path, data: Path, out: Path, settings: HarnessSettings, **kw):
    return run_evaluation(
        EvaluationRequest(
            base=str(base), tuned=str(tuned), data_dir=str(data), output_dir=str(out),
            max_examples=0, device="cpu", harness=settings, **kw,
        )
    )  # fmt: skip


def test_tiny_model_tasks_equal_direct_simple_evaluate(
    tiny_model_dir: Path, perturbed_model: Path, tiny_data: Path, tmp_path: Path
) -> None:
    settings = HarnessSettings(tasks=TASKS, num_fewshot=2, batch_size=8)
    result = evaluate(
        tiny_model_dir, perturbed_model, tiny_data, tmp_path, settings,
        thresholds=GateThresholds(max_task_regression=0.0),
    )  # fmt: skip
    document = json.loads(Path(result.metrics_path).read_text())
    for role, model in (("base", tiny_model_dir), ("tuned", perturbed_model)):
        direct = direct_scores(model, settings)
        for task in TASKS:
            ours = document["tasks"][task]
            assert ours["primary"] == direct[task]["primary"]
            assert ours["scores"][role] == pytest.approx(direct[task]["metrics"], abs=1e-12)
            assert result.metrics[f"{role}_task_{task}"] == direct[task]["metrics"][ours["primary"]]
    # Both kinds of task ran: log-likelihood (acc, acc_norm) and generation (exact match).
    assert set(document["tasks"]["llmft_facts_mc"]["metrics"]) == {"acc,none", "acc_norm,none"}
    assert document["tasks"]["llmft_facts_gen"]["metrics"] == ["exact_match,strip"]
    assert document["settings"]["harness"]["num_fewshot"] == 2
    # The gate has one check per task, failing exactly where tuned < base.
    checks = {c["name"]: c["passed"] for c in result.decision.checks}
    for task in TASKS:
        drop = result.metrics[f"base_task_{task}"] - result.metrics[f"tuned_task_{task}"]
        assert checks[f"task_regression:{task}"] == (drop <= 0)
        assert result.metrics[f"task_{task}_delta"] == pytest.approx(-drop)
    page = Path(result.report_path).read_text()
    assert '<table id="tasks">' in page and "llmft_facts_gen" in page


def test_harness_leaves_the_shared_tokenizer_unchanged(tiny_model_dir: Path) -> None:
    """HFLM sets a pad token on a tokenizer without one; the evaluator shares one tokenizer
    object between models, so the harness must work on its own copy."""
    from components.evaluation.harness import run_tasks
    from components.evaluation.loading import loaded_model

    with loaded_model(str(tiny_model_dir), device="cpu") as lm:
        tokenizer = lm.tokenizer
        tokenizer.pad_token = None
        settings = HarnessSettings(tasks=("llmft_facts_mc",), limit=2, batch_size=2)
        scores = run_tasks(lm.model, tokenizer, settings)
    assert scores["llmft_facts_mc"]["primary"] == "acc,none"
    assert tokenizer.pad_token is None


def test_unknown_task_is_refused_before_any_model_loads(
    tiny_model_dir: Path, tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import components.evaluation.evaluate as evaluate_module

    def no_loading(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(evaluate_module, "loaded_model", no_loading)
    with pytest.raises(ValueError, match="unknown eval_tasks no_such_task"):
        evaluate(
            tiny_model_dir, tiny_model_dir, tiny_data, tmp_path,
            HarnessSettings(tasks=("llmft_facts_mc", "no_such_task")),
        )  # fmt: skip


def test_judge_runs_on_the_generated_answers_and_gates(
    tiny_model_dir: Path, perturbed_model: Path, tiny_data: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The judge's wiring: held-out answers of both models go to the (faked) Vertex AI service;
    its verdicts reach metrics.json, the report and the gate."""
    from fakes.vertex_evaluation import FakeEvaluationService
    from google.auth.credentials import AnonymousCredentials
    from google.cloud.aiplatform import initializer

    from components.evaluation.judge import JudgeSettings

    monkeypatch.setattr(initializer, "global_config", initializer._Config())
    service = FakeEvaluationService(monkeypatch, {}, default="BASELINE")
    judge = JudgeSettings(
        metric="fluency", project="my-project", region="europe-west4",
        credentials=AnonymousCredentials(),
    )  # fmt: skip
    result = run_evaluation(
        EvaluationRequest(
            base=str(tiny_model_dir), tuned=str(perturbed_model), data_dir=str(tiny_data),
            output_dir=str(tmp_path), max_examples=3, max_new_tokens=8, device="cpu",
            judge=judge, thresholds=GateThresholds(judge_min_win_rate=0.5),
        )
    )  # fmt: skip
    generations = [
        json.loads(line) for line in Path(result.generations_path).read_text().splitlines()
    ]
    sent = sorted(
        json.loads(r.pairwise_metric_input.instance.json_instance)["response"]
        for r in service.requests
    )
    assert sent == sorted(g["tuned"] for g in generations)
    assert all(r.location == "projects/my-project/locations/europe-west4" for r in service.requests)
    assert result.metrics["judge_win_rate"] == 0.0 and result.metrics["judge_prompts"] == 3.0
    assert not result.passed and "judge win rate 0.000" in result.decision.failures[-1]
    document = json.loads(Path(result.metrics_path).read_text())
    assert document["judge"]["metric"] == "fluency" and document["judge"]["loss_rate"] == 1.0
    assert 'id="judge"' in Path(result.report_path).read_text()


GGUF = smollm2_gguf()


@pytest.mark.skipif(GGUF is None, reason=f"SmolLM2-135M-Instruct not installed: {INSTALL_HINT}")
def test_smollm2_tasks_equal_direct_simple_evaluate() -> None:
    """The evaluator's harness path (its loader, then `run_tasks` on the loaded model) against
    the harness's own loading; the full `run_evaluation` path is the tiny model's test above."""
    from components.evaluation.harness import run_tasks
    from components.evaluation.loading import loaded_model
    from trainer.gguf import resolve_gguf

    model = Path(resolve_gguf(str(GGUF)))
    settings = HarnessSettings(tasks=TASKS, num_fewshot=1, limit=4, batch_size=4)
    with loaded_model(str(model), device="cpu") as lm:
        ours = run_tasks(lm.model, lm.tokenizer, settings)
    assert ours == direct_scores(model, settings)
    # A real instruction model knows these facts: above chance (0.25) and some exact answers.
    assert ours["llmft_facts_mc"]["metrics"]["acc,none"] >= 0.5
    assert ours["llmft_facts_gen"]["metrics"]["exact_match,strip"] > 0
