"""A small stand-in for the fine-tune pipeline, compiled per target for the deploy tests.

No `from __future__ import annotations` here: KFP reads the component signatures' real types.
"""

from pathlib import Path
from typing import Any


def small_templates(out_dir: Path) -> dict[str, Path]:
    """Compile a two-step stand-in for the fine-tune pipeline, once per target.

    Its parameters mirror the real pipeline's (data URI, starting model, steps, trainer backend)
    so the deploy code is tested on the template shapes `llmft compile` writes, independently of
    the real pipeline's evolution. The kfp target adds kfp-kubernetes config (a second document).
    """
    from kfp import compiler, dsl, kubernetes

    @dsl.component(base_image="python:3.11-slim")
    def validate(train_data_uri: str, base_model: str, schedule_time: str) -> str:
        return train_data_uri.replace("{{$.pipeline_job_schedule_time_utc}}", schedule_time)

    @dsl.component(base_image="python:3.11-slim")
    def train(data: str, max_steps: int, backend: str) -> str:
        return f"{data}:{max_steps}:{backend}"

    def build(target: str) -> Any:
        @dsl.pipeline(name="llmft-fine-tune")
        def fine_tune(
            train_data_uri: str,
            base_model: str = "latest-registered",
            max_steps: int = 200,
            learning_rate: float = 1e-3,
            backend: str = "local",
        ) -> None:
            """Stand-in fine-tune.

            Args:
                train_data_uri: Raw records; may carry the schedule-time placeholder.
                base_model: Starting model or latest-registered.
                max_steps: Optimizer steps.
                learning_rate: Peak learning rate.
                backend: Where the trainer runs.
            """
            checked = validate(
                train_data_uri=train_data_uri,
                base_model=base_model,
                schedule_time=dsl.PIPELINE_JOB_SCHEDULE_TIME_UTC_PLACEHOLDER,
            )
            step = train(data=checked.output, max_steps=max_steps, backend=backend)
            if target == "kfp":
                kubernetes.use_secret_as_env(step, "llmft-hf-token", {"token": "HF_TOKEN"})

        return fine_tune

    paths = {}
    for target in ("vertex", "kfp"):
        paths[target] = out_dir / f"fine_tune.{target}.yaml"
        compiler.Compiler().compile(build(target), str(paths[target]))
    return paths
