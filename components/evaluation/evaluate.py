"""Evaluate a fine-tuned model against its base (and the registered champion) on the eval split.

Run: `llmft evaluate --base PATH --tuned PATH --data DIR --output DIR [--heldout FILE] ...`, or call
`run_evaluation(EvaluationRequest(...))` (the KFP `evaluate` step does). Writes to the output directory (local or
gs://):

    metrics.json        scalars, the gate decision with each check, model paths, settings, the
                        lm-evaluation-harness tasks per model and the judge's verdict
    generations.jsonl   every held-out prompt with the reference and each model's answer
                        (and, when the forgetting check is on, every general probe's answers)
    report.html         self-contained report: before/after table, training curve, samples

Models are evaluated one at a time (only one is resident in memory, sharded over every GPU when
there are several: loading.py) on exactly the same rows, prompts and harness tasks, with
deterministic greedy decoding, so differences come from the weights alone. All inputs are checked
before any model is loaded (request.py, prechecks.py): paths, the eval split, every model's tokenizer against the tokenizer
the dataset was packed with, the harness task names, and whether each model fits the evaluation
machine's GPU memory (memory_fit.py). The optional pairwise judge (judge.py) compares the base
and tuned answers to the held-out prompts after both models ran.

A model trained with objective=dpo is evaluated on the preference dataset's held-out pairs: each
model's response log-probabilities, then against the base as reference (trainer/preference.py)
the DPO loss as its eval loss, the win rate (share of pairs whose implicit reward prefers the
chosen response) and the mean reward margin (outputs.Scores.add_preference). After QLoRA
(`quantize_base="nf4"`) the reference is the base as the trainer multiplied by: its decoder
blocks' linears through the same NF4 round trip in the trainer's compute dtype
(trainer/quantize.py `round_trip_blocks`); the base's own metrics stay those of the base as given.

A model trained with objective=grpo is evaluated on the prompts dataset's held-out prompts: each
model's greedy answers scored by the run's rewards, mean reward and pass rate before and after
(reward_scores.py); the gate can require a minimum gain (`min_reward_gain`).
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass
from typing import Any

from components.evaluation import data as data_io
from components.evaluation.gate import decide
from components.evaluation.general_probes import MAX_NEW_TOKENS as PROBE_MAX_NEW_TOKENS
from components.evaluation.general_probes import load_probes
from components.evaluation.generation import generate_answers, has_chat_template
from components.evaluation.harness import check_tasks, run_tasks
from components.evaluation.judge import judge_pairwise
from components.evaluation.loading import loaded_model
from components.evaluation.outputs import (
    EvaluationResult,
    Scores,
    check_output_dir,
    write_outputs,
)
from components.evaluation.prechecks import (
    check_device,
    check_fit,
    check_objective,
    check_vocab,
    checked_tokenizers,
)
from components.evaluation.request import EvaluationRequest, check_request
from components.evaluation.reward_scores import reward_scores
from components.evaluation.scoring import score_rows
from trainer.packed_data.format import Manifest

log = logging.getLogger(__name__)


def run_evaluation(request: EvaluationRequest) -> EvaluationResult:
    """Score base, tuned (and champion) models; write metrics.json, generations.jsonl, report.html.

    Every argument is checked first (all problems in one ValueError), then every model's
    tokenizer against the dataset's, before any model is loaded.
    """
    manifest, roles, tokenizers = _checked(request)
    inputs = _inputs(request, manifest, roles, tokenizers)
    if request.objective == "grpo":  # the user's reward module runs here, in the evaluation job
        from trainer.grpo.reward_module import run_rewards

        inputs.rewards = run_rewards(request.rewards, request.reward_module)
    scores = _score_models(request, roles, tokenizers, inputs)
    if request.objective == "dpo":
        scores.add_preference(request.dpo_beta)
    if request.judge.enabled and inputs.examples:
        scores.add_judge(
            judge_pairwise(
                [ex.prompt_text for ex in inputs.examples],
                scores.answers["base"],
                scores.answers["tuned"],
                request.judge,
            )
        )
    metrics = scores.summary(inputs.probes, rows=len(inputs.rows), examples=len(inputs.examples))
    decision = decide(metrics, request.thresholds)
    log.info(
        "gate %s: %s",
        "passed" if decision.passed else "FAILED",
        decision.failures or "all checks ok",
    )
    return write_outputs(
        request.output_dir,
        scores=scores,
        decision=decision,
        roles=roles,
        examples=inputs.examples,
        probes=inputs.probes,
        num_samples=request.num_samples,
        settings=_settings(request, scores),
        train_metrics=request.train_metrics,
        train_cost=request.train_cost,
    )


def _checked(request: EvaluationRequest) -> tuple[Manifest, dict[str, str], dict[str, Any]]:
    """Everything checked before any model loads: the arguments, the device, the output
    directory, the data against the objective, every tokenizer and every model's fit. Returns
    the dataset's manifest, the models by role and their tokenizers."""
    check_request(request)
    if request.device is not None:
        check_device(request.device)
    if "://" not in request.output_dir and os.path.isfile(request.output_dir):
        raise ValueError(
            f"output {request.output_dir!r} is a file: give a directory for the report"
        )
    check_output_dir(request.output_dir, overwrite=request.overwrite)
    manifest = data_io.load_manifest(request.data_dir)
    check_objective(request.objective, manifest, request.data_dir)
    roles = {
        "base": request.base,
        "tuned": request.tuned,
        **({"champion": request.champion} if request.champion else {}),
    }
    tokenizers = checked_tokenizers(roles, manifest)
    check_fit(roles, request)
    return manifest, roles, tokenizers


def _inputs(
    request: EvaluationRequest,
    manifest: Manifest,
    roles: dict[str, str],
    tokenizers: dict[str, Any],
) -> _Inputs:
    """What every model is scored on: the eval rows, the held-out prompts, the general probes
    (when the forgetting check is on and every tokenizer can chat) and the harness tasks."""
    task_index = check_tasks(request.harness.tasks) if request.harness.tasks else None
    if request.objective == "grpo":  # prompts without packed rows: rewards, not a loss
        from components.evaluation.reward_scores import read_prompt_examples

        rows: Any = []
        examples: list[Any] = read_prompt_examples(request.data_dir, manifest, request.max_examples)
    else:
        rows = data_io.read_eval_rows(request.data_dir, manifest, request.max_eval_rows)
        examples = _examples(
            request.data_dir, request.heldout, manifest, request.max_examples, tokenizers["tuned"]
        )
    probes = load_probes() if request.thresholds.min_general_retained > 0 else []
    if probes and not all(has_chat_template(tok) for tok in tokenizers.values()):
        log.warning("a model's tokenizer has no chat template: skipping the general probes")
        probes = []
    log.info(
        "evaluating %s on %d eval rows (seq_len %d) and %d held-out prompts; thresholds %s",
        ", ".join(f"{role}={path}" for role, path in roles.items()),
        len(rows),
        manifest.seq_len,
        len(examples),
        asdict(request.thresholds),
    )
    if request.judge.enabled and not examples:
        log.warning("the judge needs held-out prompts and none are evaluated: judge skipped")
    return _Inputs(
        manifest=manifest, rows=rows, examples=examples, probes=probes, task_index=task_index
    )


def _settings(request: EvaluationRequest, scores: Scores) -> dict[str, Any]:
    """The settings metrics.json records beside the scores."""
    return {
        "data_dir": request.data_dir,
        "heldout": request.heldout,
        "max_examples": request.max_examples,
        "max_eval_rows": request.max_eval_rows,
        "max_new_tokens": request.max_new_tokens,
        "device": scores.device,
        "thresholds": asdict(request.thresholds),
        "harness": request.harness.describe(),
        "judge_metric": request.judge.metric,
        "objective": request.objective,
        "dpo_beta": request.dpo_beta,
        "rewards": request.rewards,
        "reward_module": request.reward_module,
        "quantize_base": request.quantize_base,
        "compute_dtype": request.compute_dtype,
    }


@dataclass
class _Inputs:
    """What every model is scored on: the same rows, prompts and probes."""

    manifest: Manifest
    rows: Any
    examples: list[Any]
    probes: list[Any]
    task_index: Any = None
    """The harness's task index (checked task names), None when no task runs."""
    rewards: Any = None
    """objective=grpo: the run's reward functions (loaded in this job)."""


def _score_models(
    request: EvaluationRequest, roles: dict[str, str], tokenizers: dict[str, Any], inputs: _Inputs
) -> Scores:
    """Every model in turn (only one resident in memory), on the same inputs."""
    scores = Scores()
    for role, path in roles.items():
        with loaded_model(
            path,
            what=f"{role} model",
            device=request.device,
            tokenizer=tokenizers[role],
            device_map=request.device_map,
        ) as lm:
            check_vocab(role, path, lm.model, inputs.manifest)
            scores.device = lm.describe()
            _score(lm, role, inputs, scores, request)
            if role == "base" and _quantized_reference(request):
                _score_quantized_reference(lm, inputs, scores, request)
    return scores


def _quantized_reference(request: EvaluationRequest) -> bool:
    """Whether DPO's reference is the NF4 round trip of the base (QLoRA), not the base itself."""
    return request.objective == "dpo" and request.quantize_base == "nf4"


def _score_quantized_reference(
    lm: Any, inputs: _Inputs, scores: Scores, request: EvaluationRequest
) -> None:
    """After the base's own scores: its decoder blocks' linears through the trainer's NF4 round
    trip (in place; the model is dropped after this), then the pairs' log-probabilities again,
    which replace the base's as DPO's reference (outputs.Scores.add_preference)."""
    from trainer.model import decoder_blocks, dtype_of  # torch and the trainer's model code:
    from trainer.quantize import round_trip_blocks  # only for a QLoRA-trained DPO model

    model = lm.model
    model.requires_grad_(False)  # every weight of the reference is frozen, as in the trainer
    dtype = dtype_of(request.compute_dtype, lm.device)
    names = round_trip_blocks(model, decoder_blocks(model, model.config.num_hidden_layers), dtype)
    log.info(
        "DPO reference: the base with %d linear weights through NF4 and back in %s "
        "(quantize_base=nf4, as the trainer's)",
        len(names),
        dtype,
    )
    loss = score_rows(model, inputs.rows, device=lm.device, batch_size=request.batch_size)
    assert loss.pair_logps is not None, "objective=dpo is scored on preference pairs"
    scores.add_pair_logps("base", loss.pair_logps)


def _score(lm: Any, role: str, inputs: _Inputs, scores: Scores, request: EvaluationRequest) -> None:
    """One loaded model: loss on the packed rows, answers to the prompts and the probes
    (objective=grpo: the rewards of its answers to the held-out prompts instead of a loss)."""
    if request.objective == "grpo":
        _score_rewards(lm, role, inputs, scores, request)
        return
    loss = score_rows(lm.model, inputs.rows, device=lm.device, batch_size=request.batch_size)
    scores.add_loss(role, loss)
    if loss.pair_logps is not None:
        scores.add_pair_logps(role, loss.pair_logps)
    if inputs.examples:
        answers = generate_answers(
            lm.model,
            lm.tokenizer,
            inputs.examples,
            device=lm.device,
            batch_size=request.generation_batch_size,
            max_new_tokens=request.max_new_tokens,
        )
        scores.add_answers(role, answers, inputs.examples)
    scores.add_target_tokens(loss)
    if inputs.probes:
        answers = generate_answers(
            lm.model,
            lm.tokenizer,
            [p.example() for p in inputs.probes],
            device=lm.device,
            batch_size=request.generation_batch_size,
            max_new_tokens=PROBE_MAX_NEW_TOKENS,
        )
        scores.add_probe_answers(role, answers, inputs.probes)
    if request.harness.tasks:
        scores.add_tasks(
            role, run_tasks(lm.model, lm.tokenizer, request.harness, inputs.task_index)
        )


def _score_rewards(
    lm: Any, role: str, inputs: _Inputs, scores: Scores, request: EvaluationRequest
) -> None:
    """objective=grpo: mean reward and pass rate of the model's greedy answers to the held-out
    prompts (components/evaluation/reward_scores.py), then the harness tasks as for any model."""
    answers, mean_reward, pass_rate = reward_scores(
        lm.model,
        lm.tokenizer,
        inputs.examples,
        inputs.rewards,
        max_new_tokens=request.max_new_tokens,
        batch_size=request.generation_batch_size,
    )
    scores.add_rewards(role, answers, mean_reward, pass_rate)
    if request.harness.tasks:
        scores.add_tasks(
            role, run_tasks(lm.model, lm.tokenizer, request.harness, inputs.task_index)
        )


def _examples(
    data_dir: str, heldout: str | None, manifest: Manifest, max_examples: int, tokenizer: Any
) -> list[Any]:
    """The held-out prompts to generate answers for ([] when generation is off or impossible)."""
    if max_examples <= 0:
        return []
    examples = data_io.read_examples(_example_paths(data_dir, heldout, manifest), max_examples)
    if examples and not has_chat_template(tokenizer):
        log.warning("the tuned model's tokenizer has no chat template: skipping generation")
        return []
    return examples


def _example_paths(data_dir: str, heldout: str | None, manifest: Manifest) -> list[str]:
    if heldout:
        return [heldout]
    if manifest.data_kind != "instruction":
        log.info("data kind %r has no reference answers: skipping generation", manifest.data_kind)
        return []
    paths = data_io.eval_record_files(data_dir, manifest)
    if not paths and manifest.data_kind == "instruction":
        log.warning(
            "no %s/part-*.jsonl in %s and no held-out file given: skipping generation metrics",
            data_io.EVAL_RECORDS_DIR,
            data_dir,
        )
    return paths
