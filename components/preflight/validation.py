"""Check a fine-tune run's parameters once, before anything is created or started.

The rules live with the parameters (components/params/run_params.py); this module applies them where a
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

from beam_preprocess.mix import parse_mix
from components.evaluation.harness import check_tasks, parse_tasks
from components.evaluation.memory_fit import eval_machine_error
from components.params.param_values import params_from_mapping
from components.params.run_checks import raise_errors, run_errors
from components.params.run_params import SCHEDULE_TIME_PLACEHOLDER, RunParams
from components.preflight.train_fit import training_fit_error
from components.schedules import replay
from trainer.gguf import gguf_errors, is_gguf
from trainer.grpo.reward_module import check


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


def reward_module_errors(reward_module: str, *, remote: bool) -> list[str]:
    """The reward module exists and defines its function: read, never run (trainer/grpo/
    reward_module.py `check`). A gs:// one is read only `remote` (inside the pipeline)."""
    if not reward_module or ("://" in reward_module and not remote):
        return []

    problem = check(reward_module)
    return [problem] if problem else []


def mix_data_errors(params: RunParams, *, remote: bool) -> list[str]:
    """Each source of `train_data_mix` and each replay URI must match a file, like
    train_data_uri (`data_errors`); `general` and `previous` are resolved by the validate step."""
    entries, _ = parse_mix(params.train_data_mix)  # its mistakes: the parameter checks
    uris = [e.uri for e in entries if e.uri not in ("train", params.train_data_uri)]
    if params.replay_fraction > 0:
        for name in replay.names(params.replay_source):
            if name != replay.GENERAL and not replay.PREVIOUS.match(name):
                uris.append(name)
    errors = []
    for uri in dict.fromkeys(uris):
        for pattern in uri.split(","):
            for error in data_errors(pattern.strip(), remote=remote):
                errors.append(error.replace("train_data_uri=", "mix/replay source ", 1))
    return errors


def model_errors(base_model: str) -> list[str]:
    """A local base model must exist; a local .gguf one must be a GGUF file (checked by its
    first bytes: a renamed file would otherwise fail in the training step, after preprocessing).
    Hub ids and URIs are left to the steps that read them."""
    if "://" in base_model or not base_model.strip():
        return []

    return gguf_errors(base_model, f"base_model={base_model!r}") if is_gguf(base_model) else []


def evaluation_errors(
    params: RunParams, base_model: str, *, remote: bool, check_machine: bool
) -> list[str]:
    """Evaluation must be able to run what training will produce: the harness tasks exist, and
    the model fits the evaluation machine's GPUs (a fine-tune has the base's size), so a model the
    pipeline could never evaluate, and so never register, is refused before training.

    `remote`: inside the pipeline (credentials for gs://, the image's lm-evaluation-harness);
    on the user's machine a gs:// model and a missing harness install are left to that step.
    `check_machine`: the evaluation GPUs are declared (`eval_accelerator_type` x count: the
    Vertex AI build); elsewhere the evaluate step measures the GPUs it gets.
    """
    errors = []
    if params.eval_tasks.strip(" ,"):
        try:
            check_tasks(parse_tasks(params.eval_tasks))
        except ValueError as exc:
            if remote or "unknown eval_tasks" in str(exc):
                errors.append(str(exc))
    declared = check_machine and params.eval_accelerator_count > 0
    if declared and (remote or "://" not in base_model):
        error = eval_machine_error(
            base_model, params.eval_accelerator_type, params.eval_accelerator_count
        )
        if error:
            errors.append(error)
    return errors


def check_run_parameters(values: Mapping[str, Any]) -> RunParams:
    """Parameters from a config file / `--param`s, checked: every problem in one ValueError."""
    params = params_from_mapping(values)
    errors = run_errors(params) + data_errors(params.train_data_uri, remote=False)
    errors += reward_module_errors(params.reward_module, remote=False)
    errors += mix_data_errors(params, remote=False)
    check_machine = params.backend != "local"
    raise_errors(
        errors
        or evaluation_errors(params, params.base_model, remote=False, check_machine=check_machine)
    )
    return params


def fit_errors(params: RunParams, base_model: str, *, remote: bool) -> list[str]:
    """Training must fit its GPUs (components/preflight/train_fit.py), refused before money is spent."""
    error = training_fit_error(params, base_model, remote=remote)
    return [error] if error else []
