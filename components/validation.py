"""Check a fine-tune run's parameters once, before anything is created or started.

The rules live with the parameters (components/run_params.py); this module applies them where a
run begins: `check_run_parameters` in `llmft run` / `llmft schedule` (on the user's machine, before
any credentials or server are needed) and `validate_and_resolve`, the pipeline's first step (again,
now with the run's schedule time and access to its data). Every problem is reported in one
ValueError, each saying what to change (the torchtune habit). A mistake is permanent: the first
step is never retried.
"""

from __future__ import annotations

import glob
from collections.abc import Mapping
from typing import Any

from components.run_params import (
    LATEST_REGISTERED,
    SCHEDULE_TIME_PLACEHOLDER,
    RunParams,
    params_from_mapping,
    raise_errors,
)


def data_errors(train_data_uri: str, *, remote: bool) -> list[str]:
    """The input must match at least one file: a local path or glob always, a gs:// one when
    `remote` (inside the pipeline, which has the credentials to list it)."""
    if not train_data_uri.strip() or SCHEDULE_TIME_PLACEHOLDER in train_data_uri:
        return []
    if "://" not in train_data_uri:
        found = glob.glob(train_data_uri) or glob.glob(train_data_uri.removeprefix("file:"))
    elif remote:
        import fsspec

        fs, _, paths = fsspec.get_fs_token_paths(train_data_uri, expand=True)
        found = [p for p in paths if fs.isfile(p)]
    else:
        return []
    if not found:
        return [f"train_data_uri={train_data_uri!r} matches no file: check the path or glob"]
    return []


def check_run_parameters(values: Mapping[str, Any]) -> RunParams:
    """Parameters from a config file / `--param`s, checked: every problem in one ValueError."""
    params = params_from_mapping(values)
    raise_errors(params.errors() + data_errors(params.train_data_uri, remote=False))
    return params


def validate_and_resolve(
    *, schedule_time: str, target: str = "", run_id: str = "", **values: Any
) -> tuple[str, str, str]:
    """The validate_inputs step: fill in the schedule time, check everything, resolve the models.

    `target` is the pipeline's compile target and `run_id` the run's id (checked resolved).

    Returns:
        (base_model, train_data_uri, champion_model) for this run; `latest-registered` resolves to
        the newest registered version's URI (no champion yet on a first run gives "").
    """
    uri = str(values["train_data_uri"])
    if SCHEDULE_TIME_PLACEHOLDER in uri:
        if not schedule_time or SCHEDULE_TIME_PLACEHOLDER in schedule_time:
            raise ValueError(
                f"train_data_uri contains {SCHEDULE_TIME_PLACEHOLDER} but this run was not started "
                "by a schedule: submit it with `llmft run --schedule-time ...` or give a fixed URI"
            )
        uri = uri.replace(SCHEDULE_TIME_PLACEHOLDER, schedule_time)
    params = params_from_mapping({**values, "train_data_uri": uri})
    raise_errors(params.errors(target=target, run_id=run_id) + data_errors(uri, remote=True))
    from_registry = {
        "registered_model": params.registered_model,
        "project": params.project,
        "region": params.region,
    }
    base_model, champion_model = params.base_model, params.champion_model
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
