"""The validate step's part for recurring runs: the run's mix with replay, the window check, and
the run's record (components/steps/validate.py calls `plan_run`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from beam_preprocess.mix import TRAIN, MixEntry, format_mix, parse_mix, resolve_mix
from components.schedules import replay, state, window


@dataclass(frozen=True)
class RunPlan:
    train_data_mix: str
    """The mix preprocessing reads (JSON, `train` = train_data_uri; "" for the window alone)."""
    proceed: bool
    record_uri: str
    """The run's record ("" without a work_uri)."""
    replay_fraction: float
    replay_uris: tuple[str, ...]
    message: str = ""
    warnings: tuple[str, ...] = ()


def plan_run(
    params: Any,
    window_uri: str,
    run_id: str,
    schedule_time: str,
    data_errors: Any,
    *,
    can_skip: bool = True,
) -> tuple[RunPlan, list[str]]:
    """(the plan, problems): `params` are the run parameters (train_data_uri still as written,
    with its placeholder), `window_uri` the resolved one; `data_errors(uri)` lists what is
    wrong with a replay URI (no file). `can_skip`: the pipeline can end here (not the local
    build, whose runner counts every step): otherwise an unchanged window is only reported."""
    root = ""
    if params.work_uri:
        key = state.schedule_key(params.train_data_uri, params.registered_model)
        root = state.schedule_root(params.work_uri, key)
    records = state.runs(root) if root else []
    controller = state.read_controller(root) if root else None
    fraction = float(params.replay_fraction)
    if controller and "share" in controller:  # the retention controller's share, never below
        fraction = max(float(controller["share"]), fraction)
    uris, warnings = replay.resolve(params.replay_source, records) if fraction > 0 else ([], [])
    problems = [e for uri in uris for e in _replay_errors(uri, data_errors)]
    entries, mix_problems = resolve_mix(_as_train(params), window_uri, uris, fraction)
    problems += mix_problems
    if problems:
        return RunPlan("", False, "", fraction, tuple(uris)), problems
    mix = format_mix([_named(e, window_uri) for e in entries]) if entries else ""
    proceed, message, new = True, "", None
    counted: dict[str, dict[str, Any]] = {}
    # The window is listed and its changed files counted only when the check is on (counting
    # reads them).
    if root and window.listable(window_uri) and params.min_new_records > 0:
        listing = window.list_window(window_uri)
        last = state.last_successful(records)
        new, counted = window.new_records(listing, last.get("window", {}) if last else {})
        if last and new is not None and new < params.min_new_records:
            proceed = not can_skip
            message = (
                f"skipped: nothing new ({new} new records in {window_uri} since run "
                f"{last.get('run_id')}, fewer than min_new_records={params.min_new_records})"
            )
            if not can_skip:
                message = "note: the local runner does not skip: " + message.replace(
                    "skipped: ", "", 1
                )
    record_uri = state.run_record_uri(root, run_id) if root else ""
    if record_uri:
        state.update_record(
            record_uri,
            run_id=run_id,
            started=state.now(),
            schedule_time=schedule_time,
            window_uri=window_uri,
            window=counted,
            records_new=new,
            replay_fraction=fraction,
            replay_sources=uris,
            train_data_mix=mix,
            status=state.STARTED if proceed else state.SKIPPED,
            message=message,
            registry=_registry(params),
        )
    plan = RunPlan(mix, proceed, record_uri, fraction, tuple(uris), message, tuple(warnings))
    return plan, []


def _registry(params: Any) -> dict[str, str]:
    """Where the run registers its model (`llmft history` reads which version is champion
    there); {} when it registers none."""
    if not (params.register_model and params.registered_model and params.project):
        return {}
    return {"model": params.registered_model, "project": params.project, "region": params.region}


def _as_train(params: Any) -> str:
    """`train_data_mix` with an entry naming train_data_uri as written (its placeholder
    unresolved) turned into `train`."""
    entries, problems = parse_mix(params.train_data_mix)
    if problems or not any(e.uri == params.train_data_uri for e in entries):
        return str(params.train_data_mix)
    named = [
        MixEntry(TRAIN, e.weight, e.replay) if e.uri == params.train_data_uri else e
        for e in entries
    ]
    return format_mix(named)


def _named(entry: MixEntry, window_uri: str) -> MixEntry:
    return MixEntry(TRAIN, entry.weight, entry.replay) if entry.uri == window_uri else entry


def _replay_errors(uri: str, data_errors: Any) -> list[str]:
    errors = []
    for pattern in uri.split(","):
        for error in data_errors(pattern.strip()):
            errors.append(error.replace("train_data_uri=", "replay source ", 1))
    return errors
