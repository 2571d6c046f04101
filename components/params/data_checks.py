"""Named checks of the data settings (the input's source, the mix and replay, the record
format, the chat template), each returning what to change; applied in run_checks.py beside
param_checks.py's. Beam's helpers are imported inside each check: `llmft --help` imports the
run schema's checks and need not load Beam's modules (~12 ms).
"""

from __future__ import annotations

from trainer.packed_data.format import PROMPTS_KIND

PROMPTS_NOT_MIXED = (
    "train_data_mix / replay: prompt records (data_kind=prompts) cannot be mixed yet: "
    "instruction data and preference pairs can"
)


def check_data_source(train_data_uri: str, bigquery_query: str, runner: str) -> list[str]:
    """An hf:// or bq:// input must be well formed, a BigQuery query must name {table} and go
    with a bq:// input, and BigQuery is read on Dataflow."""
    # not at the top: these keep `llmft --help` ~12 ms faster (it imports this module)
    from beam_preprocess.sources import is_bigquery, source_errors

    errors = [f"train_data_uri: {e}" for e in source_errors([train_data_uri], bigquery_query)]
    if is_bigquery(train_data_uri) and runner != "DataflowRunner":
        errors.append(
            f"train_data_uri={train_data_uri!r}: BigQuery tables are read on Dataflow; set "
            "preprocess_runner=DataflowRunner"
        )
    return errors


def check_train_data_mix(
    train_data_mix: str,
    train_data_uri: str,
    replay_source: str,
    replay_fraction: float,
    data_kind: str,
) -> list[str]:
    """The mix's form and weights (one line per bad entry), the replay sources' names, and
    their URIs' forms; whether the sources hold files is checked where they can be listed
    (components/preflight/validation.py `mix_data_errors`)."""
    # not at the top: these keep `llmft --help` fast (it imports this module)
    from beam_preprocess.mix import TRAIN, resolve_mix
    from beam_preprocess.sources import source_errors
    from components.schedules import replay

    errors = replay.syntax_errors(replay_source) if replay_fraction > 0 else []
    sources = replay.names(replay_source) if replay_fraction > 0 else []
    if replay_fraction > 0 and not sources:
        errors.append("replay_fraction is set but replay_source names no source")
    entries, problems = resolve_mix(train_data_mix, train_data_uri, sources, replay_fraction)
    errors += problems
    if entries and data_kind == PROMPTS_KIND:
        errors.append(PROMPTS_NOT_MIXED)
    uris = [e.uri for e in entries if e.uri not in (TRAIN, train_data_uri)]
    uris = [u for u in uris if u != replay.GENERAL and not replay.PREVIOUS.match(u)]
    return errors + [f"train_data_mix: {e}" for e in source_errors(uris)]


def check_record_format(
    data_kind: str, record_format: str, fields: dict[str, str] | None = None
) -> list[str]:
    """A record format shapes instruction data only; `fields` (parameter name -> field name)
    have no meaning for preference pairs either."""
    # not at the top: these keep `llmft --help` ~12 ms faster (it imports this module)
    from beam_preprocess.shapes import field_error, shape_error

    errors = []
    if problem := shape_error(data_kind, record_format):
        errors.append(f"record_format: {problem}")
    if problem := field_error(data_kind, [k for k, v in (fields or {}).items() if v]):
        errors.append(problem)
    return errors


def check_chat_template(chat_template: str) -> str | None:
    """A chat template is a known name or a Jinja template that parses."""
    # not at the top: these keep `llmft --help` ~12 ms faster (it imports this module)
    from beam_preprocess.template_library import template_error

    problem = template_error(chat_template)
    return f"chat_template: {problem}" if problem else None
