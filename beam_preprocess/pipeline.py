"""Run the preprocessing graph (beam_preprocess/graph.py): `launch` + `finish`, or `run`.

Run: `python -m beam_preprocess --input 'data/*.jsonl' --output out/ --tokenizer tok/ --seq-len 512`
(`--help` lists every flag). Locally it uses the DirectRunner's engine, in this process unless
the input and the machine are large (`local_workers`: then one worker process per core);
`--runner DataflowRunner` with the usual Google Cloud flags runs the same graph on Dataflow.

Outputs in --output (see trainer.packed_data.format): train/ and eval/ Parquet shards,
manifest.json, stats.json (the accounting, also when the run fails the rejected-fraction check),
rejected/ and filtered/ dead letters, eval_records/ (the clean held-out records for the evaluator;
not for `--data-kind preference`, whose pairs take beam_preprocess/preference_steps.py after
Prepare). `--data-kind prompts` (objective grpo) takes beam_preprocess/prompt_steps.py after
Prepare: one unpacked row per prompt record, its columns kept.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import (
    DirectOptions,
    PipelineOptions,
    StandardOptions,
)

from beam_preprocess.arg_checks import flag_given, match_inputs, reject_unknown_flags
from beam_preprocess.chat_template import ChatRenderer
from beam_preprocess.graph import build_pipeline, resolve_sources
from beam_preprocess.mix import MixSources
from beam_preprocess.mix_steps import (
    match_mix,
    mix_entries,
)
from beam_preprocess.options import PreprocessConfig, local_workers
from beam_preprocess.output_dir import (
    NOT_DATASET,
    check_output_apart_from_inputs,
    list_paths,
    prepare_output,
    relative,
)
from beam_preprocess.sources import is_file_pattern
from beam_preprocess.spill import local_spill_dir
from beam_preprocess.template_library import resolve_template
from beam_preprocess.tokenize import TokenizerSpec, load_tokenizer, pad_id_of
from trainer import storage
from trainer.packed_data.format import (
    EVAL_RECORDS_DIR,
    FILTERED_DIR,
    MANIFEST_FILE,
    PREFERENCE_KIND,
    PROMPTS_KIND,
    REJECTED_DIR,
    SPLITS,
    STATS_FILE,
    TRAIN_SPLIT,
    Manifest,
    SplitInfo,
    TokenizerIdentity,
)
from trainer.packed_data.output_lock import exclusive_output

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

DATAFLOW_RUNNERS = ("DataflowRunner", "dataflow")


@dataclass
class LaunchedRun:
    """A submitted (or, on the DirectRunner, already finished) pipeline and what finish() needs."""

    result: Any
    """Beam PipelineResult (DataflowPipelineResult on Dataflow: job_id(), cancel())."""
    config: PreprocessConfig
    tokenizer: TokenizerIdentity
    runner: str
    sources: list[dict[str, Any]] = field(default_factory=list)
    """Lineage of the hf:// and bq:// inputs (the manifest's `sources`)."""
    held: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    """The output's lock (trainer.packed_data.output_lock.exclusive_output), released by `finish`."""


def parse_options(argv: list[str]) -> tuple[PipelineOptions, PreprocessConfig]:
    """Flags -> (Beam options with local defaults filled in, validated config)."""
    reject_unknown_flags(argv)
    options = PipelineOptions(argv)
    config = PreprocessConfig.from_options(options)
    standard = options.view_as(StandardOptions)
    if standard.runner in (None, "DirectRunner", "direct"):
        # The DirectRunner's batch engine, named directly: Beam's DirectRunner first tries the
        # Prism runner, which downloads a binary (fails offline, and costs a start-up anyway).
        standard.runner = "FnApiRunner"
    if standard.runner in DATAFLOW_RUNNERS:
        from beam_preprocess.dataflow import validate_dataflow_options

        errors = validate_dataflow_options(options, config)
        if errors:
            raise ValueError("invalid Dataflow options:\n  - " + "\n  - ".join(errors))
    elif standard.runner == "FnApiRunner":
        direct = options.view_as(DirectOptions)
        if not flag_given(argv, "direct_num_workers"):
            files = tuple(p for p in config.inputs if is_file_pattern(p))
            input_bytes = match_inputs(files, config.input_format)[0]
            direct.direct_num_workers = local_workers(input_bytes, os.cpu_count() or 1)
        if not flag_given(argv, "direct_running_mode"):
            # Separate processes: tokenization and packing hold the GIL between Rust calls.
            direct.direct_running_mode = (
                "multi_processing" if direct.direct_num_workers > 1 else "in_memory"
            )
        if direct.direct_running_mode == "multi_threading":
            # Measured with Beam 2.77: 50k records in, 49,380 accounted for (the manifest check
            # refuses such a run, but only after all the work).
            raise ValueError(
                "--direct_running_mode multi_threading loses records in Beam's local runner: "
                "use multi_processing (the default with several workers) or in_memory"
            )
    return options, config


def launch(argv: list[str]) -> LaunchedRun:
    """Validate, prepare the output and start the pipeline (waits only on the DirectRunner)."""
    options, config = parse_options(argv)
    runner = options.view_as(StandardOptions).runner
    entries, patterns = mix_entries(config.train_data_mix, config.inputs)
    train_inputs = config.inputs
    if entries:  # a weighted mix reads every source's patterns (beam_preprocess.mix)
        config = replace(config, inputs=tuple(patterns))
    config, sources, bigquery = resolve_sources(config)
    problems = match_inputs(config.inputs, config.input_format)[1] if config.inputs else []
    if problems:
        raise ValueError(problems[0])
    mix = None
    if entries:
        mix = match_mix(entries, train_inputs, sources, bigquery, config.split_seed)
    tokenizer = load_tokenizer(config.tokenizer, config.chat_template)
    if config.data_kind in ("instruction", PREFERENCE_KIND, PROMPTS_KIND):
        ChatRenderer(tokenizer, fast_path=False)  # fails early without a chat template
    identity = TokenizerIdentity.of(tokenizer)
    identity.name_or_path = config.tokenizer
    # Before the lock creates the output: a run that cannot write it, or that would read it back
    # as input, creates nothing.
    check_output_apart_from_inputs(config.output, config.inputs)
    if problem := storage.not_writable(config.output):
        raise ValueError(f"--output {config.output!r}: {problem}")
    held = contextlib.ExitStack()  # one run at a time into a local output, until `finish`
    held.enter_context(exclusive_output(config.output, "llmft preprocess"))
    with _released_on_error(held), storage.disk_errors_named(config.output):
        result = _start(options, config, tokenizer, runner, bigquery, mix)
    return LaunchedRun(result, config, identity, runner, sources, held)


@contextmanager
def _released_on_error(held: contextlib.ExitStack) -> Iterator[None]:
    try:
        yield
    except BaseException:
        held.close()
        raise


def _start(
    options: PipelineOptions,
    config: PreprocessConfig,
    tokenizer: Any,
    runner: str,
    bigquery: Sequence[tuple[str, str]],
    mix: MixSources | None = None,
) -> Any:
    """Prepare the output and run (local) or submit (remote) the pipeline; its result."""
    prepare_output(config.output, config.overwrite)
    log.info("preprocessing with runner=%s, settings=%s", runner, json.dumps(config.as_dict()))
    pipeline = beam.Pipeline(options=options)
    spec = TokenizerSpec.of(
        tokenizer, config.tokenizer, config.chat_fast_path, config.chat_template
    )
    # Local runs shuffle through files (beam_preprocess.spill), remote ones through the service.
    local = runner == "FnApiRunner"
    with local_spill_dir(config.output) if local else nullcontext() as spill_dir:
        pad_id = pad_id_of(tokenizer)
        temp = build_pipeline(pipeline, config, pad_id, spec, spill_dir, bigquery, mix)
        with _heap_frozen(), _temp_removed_on_failure(temp if local else None):
            return pipeline.run()  # the local runner returns when the run is over


@contextmanager
def _temp_removed_on_failure(temp: str | None) -> Iterator[None]:
    """Delete a failed local run's uncommitted files (no hidden `.temp-*` directory is left in the
    output); the commit step deletes them when the run succeeds."""
    try:
        yield
    except BaseException:
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)
        raise


@contextmanager
def _heap_frozen() -> Iterator[None]:
    """Exempt the objects alive now (imported modules, the tokenizer) from garbage collection
    while the block runs, and hand them back after.

    The in-process runner executes the whole pipeline inside `pipeline.run()`, and Python's full
    collections, which run as the records' objects pile up, would walk every imported object
    (transformers and Beam: ~375k) each time: 3.6 s of CPU of a 50k-record run on a loaded
    machine, 0.4 s frozen (docs/performance.md). Objects created in the block are collected as
    usual. Harmless for remote runners, whose `run()` only submits.
    """
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def finish(launched: LaunchedRun) -> Manifest:
    """Wait for the pipeline, check the rejected fraction, and write manifest.json; then
    release the output."""
    out = launched.config.output
    with launched.held:
        state = launched.result.wait_until_finish()
        if str(state).rsplit(".", 1)[-1] not in ("DONE", "JOB_STATE_DONE"):
            raise RuntimeError(f"the preprocessing pipeline ended in state {state}")
        try:
            with storage.disk_errors_named(out):
                return write_manifest(launched.config, launched.tokenizer, launched.sources)
        except storage.DiskFullError:
            # A truncated manifest.json would make the dataset look complete.
            if list_paths(f"{out}/{MANIFEST_FILE}"):
                FileSystems.delete([f"{out}/{MANIFEST_FILE}"])
            raise


def run(argv: list[str]) -> Manifest:
    """Run the pipeline to completion and return the dataset's manifest."""
    return finish(launch(argv))


def write_manifest(
    config: PreprocessConfig,
    tokenizer: TokenizerIdentity,
    sources: Sequence[dict[str, Any]] = (),
) -> Manifest:
    """Build manifest.json from stats.json and the written shards (fails on too many rejects);
    `sources` is the lineage of hf:// and bq:// inputs (resolve_sources)."""
    out = config.output
    with FileSystems.open(f"{out}/{STATS_FILE}") as f:
        stats = json.loads(f.read())
    if stats["accounted"] != stats["records_read"]:
        raise RuntimeError(
            f"accounting mismatch (a bug): read {stats['records_read']} records but "
            f"accounted for {stats['accounted']}: {stats}"
        )
    read_total = stats["records_read"]
    fraction = stats["rejected"] / read_total if read_total else 0.0
    if fraction > config.max_rejected_fraction:
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(stats["rejected_by_reason"].items()))
        raise ValueError(
            f"{stats['rejected']} of {read_total} records ({fraction:.1%}) were rejected ({reasons}), "
            f"above --max-rejected-fraction {config.max_rejected_fraction}: each one and its error "
            f"is in {out}/{REJECTED_DIR}/; fix the input or raise the threshold"
        )
    if stats.get("answer_boundary_retokenized"):
        log.warning(
            "%d documents had a token spanning the end of the generation prompt and the start of "
            "the answer; they were encoded prompt and answer apart (e.g. %s): a chat template "
            "whose generation prompt ends at a token boundary (no trailing space) avoids this",
            stats["answer_boundary_retokenized"],
            ", ".join(stats["answer_boundary_sources"][:3]),
        )
    splits = {}
    for name in SPLITS:
        info = SplitInfo(**stats["splits"].get(name, {}))
        info.shards = relative(out, list_paths(f"{out}/{name}/*.parquet"))
        splits[name] = info
    if splits[TRAIN_SPLIT].rows == 0:
        raise ValueError(
            f"no training rows: all {read_total} records read from {', '.join(config.inputs)} were "
            f"filtered ({stats.get('filtered', 0)}), rejected ({stats['rejected']}) or duplicates "
            f"({stats.get('duplicates', 0)}); the reasons are in {out}/{REJECTED_DIR}/ and "
            f"{out}/{FILTERED_DIR}/"
        )
    manifest = Manifest(
        seq_len=config.seq_len,
        tokenizer=tokenizer,
        data_kind=config.data_kind,
        splits=splits,
        stats={k: v for k, v in stats.items() if k != "splits"},
        eval_records=relative(out, list_paths(f"{out}/{EVAL_RECORDS_DIR}/*.jsonl")),
        files=[p for p in relative(out, list_paths(f"{out}/**")) if p not in NOT_DATASET],
        sources=list(sources),
        chat_template=resolve_template(config.chat_template) or "",
    )
    with FileSystems.create(f"{out}/{MANIFEST_FILE}") as f:
        f.write(manifest.to_json().encode())
    return manifest
