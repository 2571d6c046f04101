"""Check a fine-tune run's parameters once, before anything is created or started.

The rules live with the parameters (components/run_params.py); this module applies them where a
run begins: `check_run_parameters` in `llmft run` / `llmft schedule` (on the user's machine, before
any credentials or server are needed) and the pipeline's first step (components/steps/validate.py:
again, now with the run's schedule time and access to its data). Every problem is reported in one
ValueError, each saying what to change (the torchtune habit). A mistake is permanent: the first
step is never retried.
"""

from __future__ import annotations

import glob
from collections.abc import Mapping
from typing import Any

from components.param_values import params_from_mapping
from components.run_params import SCHEDULE_TIME_PLACEHOLDER, RunParams, raise_errors


def data_errors(train_data_uri: str, *, remote: bool) -> list[str]:
    """The input must match at least one file: a local path or glob always, a gs:// one when
    `remote` (inside the pipeline, which has the credentials to list it)."""
    if not train_data_uri.strip() or SCHEDULE_TIME_PLACEHOLDER in train_data_uri:
        return []
    if train_data_uri.startswith(("hf://", "bq://")):
        return []  # not files: checked by their own rules (check_data_source), read by preprocess
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
