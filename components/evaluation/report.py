"""The evaluation report: one self-contained HTML page (no external files, scripts or fonts).

KFP and Vertex AI show an HTML artifact in a sandboxed frame, so everything, including the training
loss plot, is inlined (the plot as a base64 PNG). Every piece of text that came from data or models
is HTML-escaped: generated answers are untrusted input.
"""

from __future__ import annotations

import base64
import html
import io
import json
import logging
import math
from collections.abc import Sequence
from typing import Any

from components.evaluation.gate import GateDecision
from trainer import storage

log = logging.getLogger(__name__)

STEP_KEYS = ("step", "global_step")
CURVE_KEYS = {"train loss": ("loss", "train_loss"), "eval loss": ("eval_loss",)}

# (metric key suffix, label, format, lower is better)
TABLE_ROWS = (
    ("eval_loss", "Eval loss (nats / target token)", "{:.4f}", True),
    ("perplexity", "Perplexity", "{:.3f}", True),
    ("exact_match", "Exact match", "{:.3f}", False),
    ("chrf", "chrF", "{:.2f}", False),
    ("general_correct", "General probes answered (forgetting check)", "{:.3f}", False),
    (
        "win_rate",
        "Win rate on held-out pairs (implicit reward: chosen > rejected)",
        "{:.3f}",
        False,
    ),
    ("reward_margin", "Mean reward margin (chosen − rejected)", "{:.4f}", False),
    ("response_nll", "Response NLL (nats / target token)", "{:.4f}", True),
)
DPO_LOSS_LABEL = "Eval loss (DPO, nats / pair; base = reference)"
"""The eval loss's label when the metrics are DPO's (outputs.Scores.add_preference)."""


def read_training_curve(path: str) -> dict[str, list[tuple[float, float]]]:
    """Series name -> [(step, value)] from the trainer's metrics JSONL.

    Lines without a step or a loss (e.g. a run-config line) are skipped, as are unparsable lines:
    a partially written last line must not cost the whole report.
    """
    curves: dict[str, list[tuple[float, float]]] = {name: [] for name in CURVE_KEYS}
    skipped = 0
    with storage.open(path, "r") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                skipped += 1
                continue
            step = next(
                (record[k] for k in STEP_KEYS if isinstance(record.get(k), int | float)), None
            )
            if step is None:
                continue
            for name, keys in CURVE_KEYS.items():
                value = next(
                    (record[k] for k in keys if isinstance(record.get(k), int | float)), None
                )
                if value is not None and math.isfinite(value):
                    curves[name].append((float(step), float(value)))
    if skipped:
        log.warning("skipped %d unparsable lines in %s", skipped, path)
    return {name: points for name, points in curves.items() if points}


def plot_curves_png(curves: dict[str, list[tuple[float, float]]]) -> bytes:
    """A PNG line plot of the curves (matplotlib's Agg backend: no display needed)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # Figure + FigureCanvasAgg instead of pyplot: no global state, nothing to close or leak.
    fig = Figure(figsize=(7, 3.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for name, points in curves.items():
        steps, values = zip(*sorted(points), strict=True)
        ax.plot(steps, values, label=name, marker="o" if len(points) < 30 else None)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title("Training loss")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def _fmt(value: float | None, spec: str) -> str:
    if value is None:
        return "–"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return spec.format(value)


def _metrics_table(metrics: dict[str, float], has_champion: bool) -> str:
    head = ["Metric", "Base", "Tuned"] + (["Champion"] if has_champion else []) + ["Δ tuned − base"]
    rows = []
    for key, label, spec, lower_better in TABLE_ROWS:
        base, tuned = metrics.get(f"base_{key}"), metrics.get(f"tuned_{key}")
        if base is None and tuned is None:
            continue
        if key == "eval_loss" and "preference_pairs" in metrics:
            label = DPO_LOSS_LABEL
        cells = [html.escape(label), _fmt(base, spec), _fmt(tuned, spec)]
        if has_champion:
            cells.append(_fmt(metrics.get(f"champion_{key}"), spec))
        css = ""
        if base is not None and tuned is not None and math.isfinite(tuned - base):
            delta = tuned - base
            better = delta < 0 if lower_better else delta > 0
            css = "better" if better else ("worse" if delta != 0 else "")
            cells.append(("+" if delta > 0 else "") + spec.format(delta))
        else:
            cells.append("–")
        tds = "".join(
            f'<td class="{css}">{c}</td>' if i == len(cells) - 1 else f"<td>{c}</td>"
            for i, c in enumerate(cells)
        )
        rows.append(f'<tr data-metric="{key}">{tds}</tr>')
    header = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    return f'<table id="metrics"><thead><tr>{header}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def _samples_table(samples: Sequence[dict[str, Any]], has_champion: bool) -> str:
    if not samples:
        return '<p id="samples">No generation examples were evaluated.</p>'
    head = ["#", "Prompt", "Reference", "Base", "Tuned"] + (["Champion"] if has_champion else [])
    rows = []
    for i, sample in enumerate(samples, start=1):
        cells = [str(i)] + [html.escape(str(sample.get(k, ""))) for k in ("prompt", "reference")]
        for who in ["base", "tuned"] + (["champion"] if has_champion else []):
            mark = "✔" if sample.get(f"{who}_match") else "✘"
            cls = "match" if sample.get(f"{who}_match") else "miss"
            cells.append(
                f'<span class="{cls}">{mark}</span> {html.escape(str(sample.get(who, "")))}'
            )
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    header = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    return f'<table id="samples"><thead><tr>{header}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def _tasks_table(tasks: dict[str, dict[str, Any]], roles: Sequence[str]) -> str:
    """lm-evaluation-harness tasks: one row per task and metric, base vs tuned, in points."""
    if not tasks:
        return ""
    head = ["Task", "Metric"] + [r.capitalize() for r in roles] + ["Δ tuned − base (points)"]
    rows = []
    for task, entry in tasks.items():
        for key in entry["metrics"]:
            values = [entry["scores"].get(role, {}).get(key) for role in roles]
            cells = [html.escape(task), html.escape(entry["labels"][key])]
            cells += [_fmt(None if v is None else 100 * v, "{:.1f}") for v in values]
            base, tuned = (
                entry["scores"].get("base", {}).get(key),
                entry["scores"].get("tuned", {}).get(key),
            )
            css, delta_cell = "", "–"
            if base is not None and tuned is not None and math.isfinite(tuned - base):
                delta = 100 * (tuned - base)
                css = "better" if delta > 0 else ("worse" if delta < 0 else "")
                delta_cell = f"{delta:+.1f}"
            primary = ' class="primary"' if key == entry["primary"] else ""
            rows.append(
                f'<tr data-task="{html.escape(task)}"{primary}>'
                + "".join(f"<td>{c}</td>" for c in cells)
                + f'<td class="{css}">{delta_cell}</td></tr>'
            )
    header = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    return (
        "<h2>Standard tasks (lm-evaluation-harness)</h2>"
        f'<table id="tasks"><thead><tr>{header}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
    )


def _judge_section(judge: dict[str, Any] | None) -> str:
    if not judge:
        return ""
    return (
        f'<h2>Judge</h2><p id="judge">Vertex AI pairwise judge ({html.escape(judge["metric"])}): '
        f"tuned model wins {100 * judge['win_rate']:.1f}% of {judge['prompts']} prompts against "
        f"the base (ties count half; base wins {100 * judge['loss_rate']:.1f}%, ties "
        f"{100 * judge['tie_rate']:.1f}%).</p>"
    )


def _gate_section(decision: GateDecision) -> str:
    verdict = "PASSED" if decision.passed else "FAILED"
    items = "".join(
        f'<li class="{"match" if c["passed"] else "miss"}">{"✔" if c["passed"] else "✘"} '
        f"{html.escape(c['detail'])}</li>"
        for c in decision.checks
    )
    cls = "pass" if decision.passed else "fail"
    return f'<div id="gate" class="{cls}"><h2>Quality gate: {verdict}</h2><ul>{items}</ul></div>'


STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; }
table { border-collapse: collapse; margin: 8px 0 24px; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
td { font-family: ui-monospace, monospace; white-space: pre-wrap; overflow-wrap: anywhere; }
#samples td { max-width: 22em; }
.better { color: #0a7a2f; font-weight: bold; } .worse { color: #b3261e; font-weight: bold; }
tr.primary td:first-child { font-weight: bold; }
.match { color: #0a7a2f; } .miss { color: #b3261e; }
#gate.pass h2 { color: #0a7a2f; } #gate.fail h2 { color: #b3261e; }
dl { display: grid; grid-template-columns: max-content auto; gap: 2px 12px; }
dt { font-weight: bold; }
"""


def render_report(
    *,
    metrics: dict[str, float],
    decision: GateDecision,
    models: dict[str, str],
    samples: Sequence[dict[str, Any]],
    curves: dict[str, list[tuple[float, float]]] | None,
    details: dict[str, Any] | None = None,
    title: str = "Fine-tuning evaluation",
    tasks: dict[str, dict[str, Any]] | None = None,
    judge: dict[str, Any] | None = None,
) -> str:
    """The report page as a string.

    Args:
        metrics: scalars from `run_evaluation` (base_/tuned_/champion_ prefixed).
        decision: the gate's decision, shown with each check's outcome.
        models: role ("base", "tuned", "champion") -> model path, shown as provenance.
        samples: side-by-side generations: prompt, reference, base, tuned[, champion] and
            <role>_match booleans.
        curves: training curves from `read_training_curve`; None or empty omits the plot.
        details: extra key/value facts to list (dataset, rows, device, ...).
        tasks: lm-evaluation-harness results as metrics.json's "tasks" section (outputs.py).
        judge: the pairwise judge's summary as metrics.json's "judge" section.
    """
    has_champion = "champion" in models
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        _gate_section(decision),
        "<h2>Before / after</h2>",
        _metrics_table(metrics, has_champion),
        _tasks_table(tasks or {}, list(models)),
        _judge_section(judge),
        "<h2>Training loss</h2>",
    ]
    if curves:
        png = base64.b64encode(plot_curves_png(curves)).decode()
        parts.append(
            f'<img id="loss-curve" alt="training loss curve" src="data:image/png;base64,{png}">'
        )
    else:
        parts.append('<p id="loss-curve">No training metrics were given.</p>')
    parts.append("<h2>Samples</h2>")
    parts.append(_samples_table(samples, has_champion))
    facts = {**{f"{role} model": path for role, path in models.items()}, **(details or {})}
    parts.append("<h2>Details</h2><dl>")
    parts.extend(
        f"<dt>{html.escape(str(k))}</dt><dd>{html.escape(str(v))}</dd>" for k, v in facts.items()
    )
    parts.append("</dl></body></html>")
    return "\n".join(parts)
