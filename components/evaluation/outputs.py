"""What an evaluation keeps and writes: per-model scores, metrics.json, generations.jsonl and
report.html (local or gs://), and the `EvaluationResult` handed back (components/evaluation/
evaluate.py runs the models)."""

from __future__ import annotations

import contextlib
import json
import logging
import math
from dataclasses import dataclass, field
from typing import Any

from components.evaluation.gate import GateDecision
from components.evaluation.general_probes import retained
from components.evaluation.harness import flat_metrics, metric_label
from components.evaluation.report import read_training_curve, render_report
from components.evaluation.text_metrics import chrf, exact_match, normalize_answer
from trainer import storage

METRICS_FILE = "metrics.json"
PAIR_METRICS = ("win_rate", "reward_margin", "response_nll")
"""Per-model metrics of a DPO evaluation besides the eval loss (`Scores.add_preference`)."""
REPORT_FILE = "report.html"
GENERATIONS_FILE = "generations.jsonl"

log = logging.getLogger(__name__)


@dataclass
class EvaluationResult:
    metrics: dict[str, float]
    """Scalars for a KFP Metrics artifact: <role>_eval_loss, <role>_perplexity,
    <role>_exact_match, <role>_chrf, <role>_general_correct (with the forgetting check),
    <role>_task_<task> (harness tasks' headline metrics, 0..1) for role in base/tuned[/champion],
    *_delta (tuned - base), general_retained, judge_win_rate/loss_rate/tie_rate/prompts/errors (with
    the judge), eval_rows, eval_target_tokens, generation_examples; with objective=dpo
    <role>_eval_loss is the DPO loss per pair (base as reference; after QLoRA the base's NF4
    round trip, as the trainer's), with <role>_win_rate,
    <role>_reward_margin, <role>_response_nll (instead of perplexity) and preference_pairs; with
    objective=grpo <role>_mean_reward and <role>_pass_rate on the held-out prompts (and
    mean_reward_delta, the gain), <role>_eval_loss their negated mean reward."""
    passed: bool
    decision: GateDecision
    metrics_path: str
    report_path: str
    generations_path: str
    samples: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Scores:
    """What each model (role) scored, collected one model at a time."""

    metrics: dict[str, float] = field(default_factory=dict)
    answers: dict[str, list[str]] = field(default_factory=dict)
    probe_answers: dict[str, list[str]] = field(default_factory=dict)
    probe_correct: dict[str, list[bool]] = field(default_factory=dict)
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Role -> lm-evaluation-harness results (`harness.run_tasks`)."""
    judge: Any = None
    """The pairwise judge's `JudgeResult`, when the judge ran."""
    device: str = ""
    """The device and dtype the models ran on, e.g. `cuda:0 (bfloat16)`."""
    pair_logps: dict[str, Any] = field(default_factory=dict)
    """Preference data: role -> [pairs, 2] response log-probabilities (scoring.LossResult)."""

    def add_tasks(self, role: str, results: dict[str, dict[str, Any]]) -> None:
        self.tasks[role] = results
        self.metrics.update(flat_metrics(role, results))
        log.info(
            "%s: %s",
            role,
            ", ".join(
                f"{task} {r['primary']}={r['metrics'][r['primary']]:.4f}"
                for task, r in results.items()
            ),
        )

    def add_judge(self, result: Any) -> None:
        self.judge = result
        self.metrics.update(result.metrics())

    def tasks_section(self) -> dict[str, dict[str, Any]]:
        """Per task: the headline metric, every metric's label, and each role's values (the
        "tasks" section of metrics.json, and the report's table)."""
        section: dict[str, dict[str, Any]] = {}
        for role, results in self.tasks.items():
            for task, result in results.items():
                entry = section.setdefault(
                    task, {"primary": result["primary"], "metrics": [], "labels": {}, "scores": {}}
                )
                for key in result["metrics"]:
                    if key not in entry["labels"]:
                        entry["metrics"].append(key)
                        entry["labels"][key] = metric_label(key)
                entry["scores"][role] = {
                    k: (v if math.isfinite(v) else None) for k, v in result["metrics"].items()
                }
        return section

    def judge_section(self) -> dict[str, Any] | None:
        if self.judge is None:
            return None
        m = self.judge.metrics()
        return {
            "metric": self.judge.metric,
            "win_rate": m["judge_win_rate"],
            "loss_rate": m["judge_loss_rate"],
            "tie_rate": m["judge_tie_rate"],
            "prompts": int(m["judge_prompts"]),
            "errors": int(m["judge_errors"]),
        }

    def add_loss(self, role: str, loss: Any) -> None:
        self.metrics[f"{role}_eval_loss"] = loss.loss
        self.metrics[f"{role}_perplexity"] = loss.perplexity
        log.info("%s: eval loss %.4f, perplexity %.3f", role, loss.loss, loss.perplexity)

    def add_pair_logps(self, role: str, logps: Any) -> None:
        self.pair_logps[role] = logps

    def add_preference(self, beta: float) -> None:
        """DPO's view of the held-out pairs, every model against the base's log-probabilities
        as reference (the trainer's reference is the base with its adapters off; after QLoRA
        the base's are those of its NF4 round trip, evaluate.py, so the base's DPO numbers are
        the reference's own): `<role>_eval_loss` becomes the mean DPO loss per pair (the trainer's eval_loss; the
        base's is log 2), the win rate is the share of pairs whose implicit reward prefers the
        chosen response (the trainer's reward accuracy), the margin r_chosen - r_rejected is
        averaged; the token-level loss stays as `<role>_response_nll` (perplexity is dropped:
        it would not match the loss)."""
        import torch

        # imports torch: only when DPO pairs are scored
        from trainer.preference import dpo_losses, margins

        reference = torch.from_numpy(self.pair_logps["base"])
        for role, logps in self.pair_logps.items():
            policy = torch.from_numpy(logps)
            margin = margins(policy, reference, beta)
            self.metrics[f"{role}_response_nll"] = self.metrics[f"{role}_eval_loss"]
            self.metrics.pop(f"{role}_perplexity", None)
            self.metrics[f"{role}_eval_loss"] = float(dpo_losses(policy, reference, beta).mean())
            self.metrics[f"{role}_win_rate"] = float((margin > 0).double().mean())
            self.metrics[f"{role}_reward_margin"] = float(margin.mean())
            log.info(
                "%s: DPO loss %.4f, win rate %.3f, reward margin %.4f on %d held-out pairs",
                role,
                self.metrics[f"{role}_eval_loss"],
                self.metrics[f"{role}_win_rate"],
                self.metrics[f"{role}_reward_margin"],
                len(reference),
            )
        self.metrics["preference_pairs"] = float(len(reference))

    def add_rewards(
        self, role: str, answers: list[str], mean_reward: float, pass_rate: float
    ) -> None:
        """objective=grpo: the held-out prompts' mean reward and pass rate
        (reward_scores.py); `<role>_eval_loss` is the negated mean reward (lower is better, as
        for every objective: the loss and champion checks read it)."""
        self.answers[role] = answers
        self.metrics[f"{role}_mean_reward"] = mean_reward
        self.metrics[f"{role}_pass_rate"] = pass_rate
        self.metrics[f"{role}_eval_loss"] = -mean_reward
        self.metrics.setdefault("eval_target_tokens", 0.0)
        log.info("%s: mean reward %.4f, pass rate %.3f", role, mean_reward, pass_rate)

    def add_target_tokens(self, loss: Any) -> None:
        self.metrics["eval_target_tokens"] = float(loss.target_tokens)

    def add_answers(self, role: str, answers: list[str], examples: list[Any]) -> None:
        references = [ex.reference for ex in examples]
        self.answers[role] = answers
        self.metrics[f"{role}_exact_match"] = exact_match(answers, references)
        self.metrics[f"{role}_chrf"] = chrf(answers, references)
        log.info(
            "%s: exact match %.3f, chrF %.2f",
            role,
            self.metrics[f"{role}_exact_match"],
            self.metrics[f"{role}_chrf"],
        )

    def add_probe_answers(self, role: str, answers: list[str], probes: list[Any]) -> None:
        self.probe_answers[role] = answers
        self.probe_correct[role] = [p.is_correct(a) for p, a in zip(probes, answers, strict=True)]
        self.metrics[f"{role}_general_correct"] = sum(self.probe_correct[role]) / len(probes)
        log.info("%s: general probes answered %.3f", role, self.metrics[f"{role}_general_correct"])

    def summary(self, probes: list[Any], *, rows: int, examples: int) -> dict[str, float]:
        """The metrics with the forgetting check, tuned - base deltas and counts added."""
        metrics = self.metrics
        if probes:
            kept = retained(self.probe_correct["base"], self.probe_correct["tuned"])
            if kept is not None:
                metrics["general_retained"] = kept
        tasks = [f"task_{t}" for t in self.tasks.get("tuned", {})]
        keys = ["eval_loss", "perplexity", "exact_match", "chrf", "general_correct", *PAIR_METRICS]
        keys += ["mean_reward", "pass_rate"]
        for key in (*keys, *tasks):
            if f"tuned_{key}" in metrics and f"base_{key}" in metrics:
                metrics[f"{key}_delta"] = metrics[f"tuned_{key}"] - metrics[f"base_{key}"]
        metrics["eval_rows"] = float(rows)
        metrics["generation_examples"] = float(examples)
        return metrics


def generations(
    scores: Scores, roles: dict[str, str], examples: list[Any], probes: list[Any]
) -> list[dict[str, Any]]:
    """Every held-out prompt, then every general probe, with each model's answer."""
    entries = []
    for i, ex in enumerate(examples):
        entry: dict[str, Any] = {"prompt": ex.prompt_text, "reference": ex.reference}
        for role in roles:
            answer = scores.answers[role][i]
            entry[role] = answer
            entry[f"{role}_match"] = normalize_answer(answer) == normalize_answer(ex.reference)
        entries.append(entry)
    for i, probe in enumerate(probes):
        entry = {"probe": probe.question, "reference": " | ".join(probe.answers)}
        for role in roles:
            entry[role] = scores.probe_answers[role][i]
            entry[f"{role}_match"] = scores.probe_correct[role][i]
        entries.append(entry)
    return entries


OUTPUT_FILES = (METRICS_FILE, GENERATIONS_FILE, REPORT_FILE)


def check_output_dir(output_dir: str, *, overwrite: bool) -> None:
    """Refuse an `output_dir` that cannot be written, and to replace files in it that an
    earlier evaluation did not write.

    The files an evaluation writes (`OUTPUT_FILES`) may be replaced when the directory's
    metrics.json is an evaluation's (a re-run or a retried task); a user's own files of those
    names are replaced only with `overwrite`. Other files in the directory are never touched.

    Raises:
        ValueError: what is there, and the way out.
    """
    out = output_dir.rstrip("/")
    if problem := storage.not_writable(out):
        raise ValueError(f"output {output_dir!r}: {problem}")
    taken = [name for name in OUTPUT_FILES if storage.exists(f"{out}/{name}")]
    if not taken or overwrite or _written_by_evaluation(f"{out}/{METRICS_FILE}"):
        return
    raise ValueError(
        f"output {output_dir!r} already holds {', '.join(taken)}, which no llmft evaluation "
        "wrote: choose another --output, or pass --overwrite to replace them"
    )


def _written_by_evaluation(metrics_path: str) -> bool:
    try:
        document = json.loads(storage.read_text(metrics_path))
    except (OSError, ValueError):
        return False
    return isinstance(document, dict) and {"metrics", "passed", "models"} <= document.keys()


def write_outputs(
    output_dir: str,
    *,
    scores: Scores,
    decision: GateDecision,
    roles: dict[str, str],
    examples: list[Any],
    probes: list[Any],
    num_samples: int,
    settings: dict[str, Any],
    train_metrics: str | None,
    train_cost: str | None = None,
) -> EvaluationResult:
    """Write metrics.json, generations.jsonl and report.html under `output_dir`; the training
    job's actual cost (`train_cost`, a cost.json) goes into both."""
    metrics = scores.metrics
    entries = generations(scores, roles, examples, probes)
    samples = entries[: min(num_samples, len(examples))]
    out = output_dir.rstrip("/")
    if "://" not in out:
        from pathlib import Path

        Path(out).mkdir(parents=True, exist_ok=True)
    metrics_path, report_path = f"{out}/{METRICS_FILE}", f"{out}/{REPORT_FILE}"
    generations_path = f"{out}/{GENERATIONS_FILE}"
    # NaN/inf are not JSON: a diverged model's perplexity is written as null.
    json_metrics = {k: (v if math.isfinite(v) else None) for k, v in metrics.items()}
    document = {
        "metrics": json_metrics,
        "passed": decision.passed,
        "checks": decision.checks,
        "models": roles,
        "settings": settings,
        "tasks": scores.tasks_section(),
        "judge": scores.judge_section(),
    }
    cost = json.loads(storage.read_text(train_cost)) if train_cost else None
    if cost is not None:
        document["training_cost"] = cost
    details = {
        "dataset": settings["data_dir"],
        "eval rows scored": int(metrics["eval_rows"]),
        "target tokens": int(metrics["eval_target_tokens"]),
        "held-out prompts": len(examples),
        **_preference_details(metrics, settings),
        "device": scores.device,
        "training metrics": train_metrics or "–",
    }
    if cost is not None:
        details |= cost_details(cost)
    details |= phase_details(_sibling_summary(train_metrics)) if train_metrics else {}
    curves = read_training_curve(train_metrics) if train_metrics else None
    page = render_report(
        metrics=metrics,
        decision=decision,
        models=roles,
        samples=samples,
        curves=curves,
        details=details,
        tasks=scores.tasks_section(),
        judge=scores.judge_section(),
    )
    _write_files(
        out,
        {
            generations_path: "".join(json.dumps(g) + "\n" for g in entries),
            report_path: page,
            metrics_path: json.dumps(document, indent=2) + "\n",  # last: it marks them complete
        },
    )
    log.info("wrote %s and %s", metrics_path, report_path)
    return EvaluationResult(
        metrics=metrics,
        passed=decision.passed,
        decision=decision,
        metrics_path=metrics_path,
        report_path=report_path,
        generations_path=generations_path,
        samples=samples,
    )


def _write_files(out: str, files: dict[str, str]) -> None:
    """Write `files` in order; on a full disk remove the ones written (an evaluation's own files:
    `check_output_dir` let them be replaced), so no half-written evaluation is left that looks
    complete, and raise the DiskFullError naming the disk."""
    written: list[str] = []
    try:
        with storage.disk_errors_named(out):
            for path, text in files.items():
                written.append(path)
                storage.write_text(path, text)
    except storage.DiskFullError:
        for path in written:
            with contextlib.suppress(OSError):
                storage.remove(path)
        raise


def _preference_details(metrics: dict[str, float], settings: dict[str, Any]) -> dict[str, Any]:
    """The report's lines on the DPO evaluation (none for other objectives)."""
    if "preference_pairs" not in metrics:
        return {}
    reference = "the base model"
    if settings.get("quantize_base", "none") != "none":
        reference = (
            f"the base with its decoder blocks' linears through {settings['quantize_base']} "
            f"and back ({settings['compute_dtype']}), as the trainer's; the base's own loss, "
            "answers and tasks are the base as given"
        )
    return {
        "held-out preference pairs": int(metrics["preference_pairs"]),
        "DPO beta (implicit rewards)": settings["dpo_beta"],
        "DPO reference": reference,
    }


def _sibling_summary(train_metrics: str) -> dict[str, Any]:
    """The trainer's summary.json beside its metrics.jsonl ({} when there is none)."""
    path = f"{train_metrics.rsplit('/', 1)[0]}/summary.json" if "/" in train_metrics else ""
    if not path or not storage.exists(path):
        return {}
    try:
        summary = json.loads(storage.read_text(path))
    except (OSError, ValueError):
        return {}
    return summary if isinstance(summary, dict) else {}


def phase_details(summary: dict[str, Any]) -> dict[str, str]:
    """The report's line on where GRPO's training time went (summary.json's phase totals)."""
    generate, train = summary.get("generate_s_total"), summary.get("train_s_total")
    if not isinstance(generate, int | float) or not isinstance(train, int | float):
        return {}
    total = generate + train
    share = f" ({generate / total:.0%} generating)" if total > 0 else ""
    return {"GRPO steps": f"generating {generate:,.0f} s, training {train:,.0f} s{share}"}


def cost_details(cost: dict[str, Any]) -> dict[str, str]:
    """The report's lines on what training cost (the train step's cost.json)."""
    details = {
        "training GPU-hours": f"{cost['gpu_hours']:.2f} ({cost['gpus']} GPUs x {cost['hours']:.2f} h)",
        "training cost": f"${cost['cost_usd']:,.2f} at ${cost['gpu_hour_usd']:.2f}/GPU-h, "
        f"{cost['capacity']}",
        "training job": f"{cost['started']} to {cost['ended']}",
    }
    if cost.get("attempts") is not None:
        details["training starts / preemptions"] = f"{cost['attempts']} / {cost['preemptions']}"
    if cost.get("queue_wait_s"):
        details["waiting in the Kueue queue"] = f"{cost['queue_wait_s']:.0f} s (not billed)"
    return details
