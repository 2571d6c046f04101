"""Validate a fine-tune run's parameters up front, before anything costly starts.

The pipeline's first step calls `check_run_parameters`; `llmft run` calls it too, so a bad
parameter fails in a second on the user's machine instead of an hour into a cloud run. All errors
are collected and reported together (the torchtune habit), each saying what to change.
"""

from __future__ import annotations

import re
from typing import Any

BACKENDS = ("local", "gke", "vertex")
RDZV_BACKENDS = ("etcd-v3", "etcd-v2", "c10d")
RUNNERS = ("DirectRunner", "DataflowRunner")
DATA_KINDS = ("instruction", "text")
SCHEDULE_TIME_PLACEHOLDER = "{{$.pipeline_job_schedule_time_utc}}"
"""KFP's schedule-time placeholder, written literally in `train_data_uri` by scheduled runs."""
LATEST_REGISTERED = "latest-registered"
"""`base_model` value meaning: continue from the latest version in Vertex AI Model Registry."""


def run_parameter_errors(
    *,
    backend: str,
    train_data_uri: str,
    data_kind: str,
    base_model: str,
    seq_len: int,
    eval_fraction: float,
    preprocess_runner: str,
    nodes: int,
    nproc_per_node: int,
    rdzv_backend: str,
    max_steps: int,
    learning_rate: float,
    project: str = "",
    region: str = "",
    work_uri: str = "",
    registered_model: str = "",
    register_model: bool = False,
    serving_image: str = "",
    max_eval_examples: int = 1,
    min_general_retained: float = 0.0,
    **_ignored: Any,
) -> list[str]:
    """Every problem with these run parameters, each with what to change; [] when valid."""
    errors: list[str] = []

    def need(ok: bool, message: str) -> None:
        if not ok:
            errors.append(message)

    need(backend in BACKENDS, f"backend={backend!r}: choose one of {', '.join(BACKENDS)}")
    need(
        bool(train_data_uri.strip()),
        "train_data_uri is empty: give a file, glob or gs:// URI of JSONL/JSON/CSV/Parquet records",
    )
    need(data_kind in DATA_KINDS, f"data_kind={data_kind!r}: choose one of {', '.join(DATA_KINDS)}")
    need(
        bool(base_model.strip()),
        f"base_model is empty: give a local path, gs:// URI, hub id or {LATEST_REGISTERED!r}",
    )
    need(16 <= seq_len <= 131072, f"seq_len={seq_len}: use a value between 16 and 131072")
    need(0.0 < eval_fraction < 0.5, f"eval_fraction={eval_fraction}: use a fraction in (0, 0.5)")
    need(
        preprocess_runner in RUNNERS,
        f"preprocess_runner={preprocess_runner!r}: choose one of {', '.join(RUNNERS)}",
    )
    need(nodes >= 1, f"nodes={nodes}: use at least 1")
    need(nproc_per_node >= 1, f"nproc_per_node={nproc_per_node}: use at least 1")
    need(
        rdzv_backend in RDZV_BACKENDS,
        f"rdzv_backend={rdzv_backend!r}: choose one of {', '.join(RDZV_BACKENDS)}",
    )
    need(max_steps >= 1, f"max_steps={max_steps}: use at least 1")
    need(0.0 < learning_rate < 1.0, f"learning_rate={learning_rate}: use a value in (0, 1)")
    need(max_eval_examples >= 1, f"max_eval_examples={max_eval_examples}: use at least 1")
    need(
        0.0 <= min_general_retained <= 1.0,
        f"min_general_retained={min_general_retained}: use a fraction in [0, 1] (0 disables)",
    )

    cloud = backend in ("gke", "vertex") or preprocess_runner == "DataflowRunner"
    if cloud:
        need(
            bool(project),
            "project is empty: set the Google Cloud project id for cloud backends and Dataflow",
        )
        need(bool(region), "region is empty: set a Google Cloud region such as us-central1")
        need(
            work_uri.startswith("gs://"),
            f"work_uri={work_uri!r}: cloud runs need a gs:// URI for shared run files",
        )
        need(
            train_data_uri.startswith("gs://"),
            f"train_data_uri={train_data_uri!r}: workers in the cloud cannot read local files; upload the data to gs://",
        )
    if base_model == LATEST_REGISTERED or register_model:
        need(
            bool(registered_model),
            "registered_model is empty: name the Vertex AI model (resource name or display name) to "
            f"register to or to take {LATEST_REGISTERED!r} from",
        )
    if register_model:
        need(
            bool(serving_image),
            "serving_image is empty: registering a model needs a serving container image",
        )
        need(":latest" not in serving_image, "serving_image uses :latest: pin a version tag")
    if project:
        need(
            re.fullmatch(r"[a-z][a-z0-9-]{4,28}[a-z0-9]", project) is not None,
            f"project={project!r} is not a valid Google Cloud project id",
        )
    return errors


def _raise_if_any(errors: list[str]) -> None:
    if errors:
        raise ValueError(
            f"{len(errors)} invalid run parameter(s):\n" + "\n".join(f"  - {e}" for e in errors)
        )


def check_run_parameters(**params: Any) -> None:
    """Raise ValueError listing every problem with the run parameters."""
    _raise_if_any(run_parameter_errors(**params))


def validate_and_resolve(
    *, schedule_time: str, champion_model: str = "", **params: Any
) -> tuple[str, str, str]:
    """The validate_inputs step: fill in the schedule time, check everything, resolve the models.

    Returns:
        (base_model, train_data_uri, champion_model) for this run; `latest-registered` resolves to
        the newest registered version's URI (no champion yet on a first run gives "").
    """
    uri = str(params["train_data_uri"])
    if SCHEDULE_TIME_PLACEHOLDER in uri:
        if not schedule_time or SCHEDULE_TIME_PLACEHOLDER in schedule_time:
            raise ValueError(
                f"train_data_uri contains {SCHEDULE_TIME_PLACEHOLDER} but this run was not started "
                "by a schedule: submit it with `llmft run --schedule-time ...` or give a fixed URI"
            )
        uri = uri.replace(SCHEDULE_TIME_PLACEHOLDER, schedule_time)
        params["train_data_uri"] = uri
    errors = run_parameter_errors(**params)
    if champion_model == LATEST_REGISTERED and not params.get("registered_model"):
        errors.append(
            "champion_model is 'latest-registered' but registered_model is empty: name the model"
        )
    _raise_if_any(errors)
    from_registry = {
        "model": params["registered_model"],
        "project": params["project"],
        "location": params["region"],
    }
    base_model = str(params["base_model"])
    if base_model == LATEST_REGISTERED:
        from components.registry import latest_registered_model_uri

        base_model = latest_registered_model_uri(**from_registry)
    if champion_model == LATEST_REGISTERED:
        from components.registry import latest_registered_model_uri

        try:
            champion_model = latest_registered_model_uri(**from_registry)
        except ValueError:
            champion_model = ""  # nothing registered yet: the first run has no champion
    return base_model, uri, champion_model
