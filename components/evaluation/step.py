"""The `evaluate` KFP component's parameters mapped onto `run_evaluation`.

The tuned Model artifact is the exported Hugging Face model itself; the training curve is in the
trainer's run directory, its `run_uri` metadata (`<run dir>/metrics.jsonl`).
The component writes the report to its HTML artifact and logs the scalars to its Metrics
artifact; metrics.json and generations.jsonl go to a temporary directory that is removed.
"""

from __future__ import annotations

import logging
import math
import shutil
import tempfile
from typing import Any

from components.evaluation.evaluate import run_evaluation
from trainer import storage

log = logging.getLogger(__name__)


def run_evaluate_component(
    *,
    base_model: str,
    tuned_model_uri: str,
    tuned_metadata: dict[str, Any],
    dataset_uri: str,
    max_examples: int,
    min_loss_improvement: float,
    min_exact_match: float,
    champion_model: str,
    min_general_retained: float = 0.0,
    report_path: str,
    project: str = "",
    hf_token_secret: str = "",
) -> tuple[dict[str, float], bool]:
    """Evaluate; write the HTML report to `report_path`; return (finite scalars, passed).

    A gated hub base model needs the Hugging Face token: read from Secret Manager by name
    (`hf_token_secret` in `project`) unless HF_TOKEN is already set (components/secrets.py).
    """
    from components.secrets import load_hf_token

    load_hf_token(project=project, secret=hf_token_secret)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    tuned = storage.normalize(str(tuned_metadata.get("model_uri") or tuned_model_uri))
    run_dir = storage.normalize(str(tuned_metadata.get("run_uri") or "")).rstrip("/")
    train_metrics = f"{run_dir}/metrics.jsonl" if run_dir else ""
    with tempfile.TemporaryDirectory(prefix="llmft-evaluate-") as out:
        result = run_evaluation(
            base=base_model,
            tuned=tuned,
            data_dir=storage.normalize(dataset_uri),
            output_dir=out,
            max_examples=max_examples,
            train_metrics=train_metrics
            if train_metrics and storage.exists(train_metrics)
            else None,
            champion=champion_model or None,
            min_loss_improvement=min_loss_improvement,
            min_exact_match=min_exact_match,
            min_general_retained=min_general_retained,
        )
        shutil.copyfile(result.report_path, report_path)
    # KFP Metrics (and the Vertex console) take finite numbers only; a diverged perplexity is
    # left out rather than failing the step.
    scalars = {k: float(v) for k, v in result.metrics.items() if math.isfinite(v)}
    scalars["passed"] = 1.0 if result.passed else 0.0
    return scalars, result.passed
