"""The preprocessing graph: `build_pipeline(pipeline, config, ...)` adds every step to a Beam
pipeline, from reading the inputs (`resolve_sources` pins hf:// and bq:// first) through
Prepare, the data kind's tokenize and pack steps, the shard writers and their one commit, to
the stats. beam_preprocess/pipeline.py launches and finishes a run of it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import apache_beam as beam

from beam_preprocess import bigquery_source, hf_source
from beam_preprocess.mix import MixSources
from beam_preprocess.mix_steps import (
    MIX,
    MIX_TOKENS,
    PlanMix,
    letter_events,
    plan_event,
)
from beam_preprocess.options import PreprocessConfig
from beam_preprocess.preference_steps import DeduplicateAndPackPairs, TokenizePairs
from beam_preprocess.prompt_steps import CountPromptTokens, DeduplicateAndWritePrompts
from beam_preprocess.readers import ReadRecords
from beam_preprocess.record_steps import Prepare
from beam_preprocess.records import (
    DEAD,
    EVAL_RECORDS,
    FILTERED,
    OUTCOME,
    READ,
    READ_FILES,
    RETOKENIZED,
    STATS,
    UNUSED_FIELDS,
)
from beam_preprocess.sinks import JSONL, PARQUET, CommitShards, Shards, WriteShards, temp_dir_for
from beam_preprocess.sources import is_bigquery, is_file_pattern, is_hf
from beam_preprocess.stats import WriteStats, tagged
from beam_preprocess.token_steps import TABLES, TAIL_TABLES, DeduplicateAndPack, Tokenize
from trainer.packed_data.format import (
    EVAL_RECORDS_DIR,
    FILTERED_DIR,
    PREFERENCE_KIND,
    PROMPTS_KIND,
    REJECTED_DIR,
    SPLITS,
    STATS_FILE,
    table_schema,
)

if TYPE_CHECKING:
    from beam_preprocess.tokenize import TokenizerSpec

log = logging.getLogger(__name__)


def build_pipeline(
    pipeline: beam.Pipeline,
    config: PreprocessConfig,
    pad_id: int,
    tokenizer_spec: TokenizerSpec | None = None,
    spill_dir: str | None = None,
    bigquery: Sequence[tuple[str, str]] = (),
    mix: MixSources | None = None,
) -> str:
    """Add the whole preprocessing graph to `pipeline` (nothing runs until pipeline.run()); returns
    the directory of the run's uncommitted files (the final commit step deletes it).

    Pass `tokenizer_spec` when the full tokenizer is at hand (see TokenizerSpec): the workers then
    start without importing transformers. `spill_dir` (local runs) keeps the shuffle on disk.
    `bigquery` lists the bq:// inputs with their snapshot times (`resolve_sources`); the file
    patterns of `config.inputs` are read by ReadRecords. `mix` (`mix_sources`) samples the
    sources of a weighted mix (beam_preprocess.mix) and counts each one.
    """
    out = config.output
    temp = temp_dir_for(out)
    read = _read(pipeline, config, bigquery, mix)
    examples = read["records"] | "Prepare" >> Prepare(config)
    pairs = config.data_kind == PREFERENCE_KIND
    prompts = config.data_kind == PROMPTS_KIND
    tokens, packed, stages, plan = _tokenize_and_pack(
        examples, config, pad_id, tokenizer_spec, spill_dir, mix
    )
    schema = table_schema(config.data_kind)

    # Every output is written inside the stage that produces it (beam_preprocess.sinks), and all
    # files are committed together at the end.
    outputs = {
        f"{name}{suffix}": Shards(f"{out}/{name}/part{suffix}", PARQUET)
        for _, suffix in stages
        for name in SPLITS
    }
    for kind, directory in ((DEAD, REJECTED_DIR), (FILTERED, FILTERED_DIR)):
        outputs[kind] = Shards(f"{out}/{directory}/part", JSONL)
    if not pairs:  # pairs have no reference answer to generate against
        outputs[EVAL_RECORDS] = Shards(f"{out}/{EVAL_RECORDS_DIR}/part", JSONL)
    written = []
    for stage, suffix in stages:
        label = suffix.replace("-", "").title()
        tables = packed[stage] | f"BySplit{label}" >> beam.ParDo(_BySplit()).with_outputs(*SPLITS)
        for name in SPLITS:
            shards = outputs[f"{name}{suffix}"]
            writer = WriteShards(shards, temp, schema)
            written.append(tables[name] | f"Write{name.title()}{label}" >> writer)
    letters = [
        ("Read", read, DEAD),
        ("Prepare", examples, DEAD),
        ("Prepare", examples, FILTERED),
        ("Tokenize", tokens, DEAD),
        ("Tokenize", tokens, FILTERED),
    ]
    if not pairs:
        letters.append(("Pack", packed, EVAL_RECORDS))
    for step, results, kind in letters:
        writer = WriteShards(outputs[kind], temp)
        written.append(results[kind] | f"Write{kind.title()}Of{step}" >> writer)
    _ = (
        written
        | "AllWritten" >> beam.Flatten()
        | "CommitShards" >> CommitShards(outputs.values(), temp, schema)
    )

    events = [read[READ] | "TagRead" >> tagged(READ), packed[STATS] | "TagStats" >> tagged(STATS)]
    if not pairs and not prompts:
        events.append(packed[RETOKENIZED] | "TagRetokenized" >> tagged(RETOKENIZED))
    events.append(examples[UNUSED_FIELDS] | "TagUnusedFields" >> tagged(UNUSED_FIELDS))
    for step, results in (("Read", read), ("Prepare", examples), ("Tokenize", tokens)):
        events.append(results[OUTCOME] | f"TagOutcomesOf{step}" >> tagged(OUTCOME))
    events.append(packed[OUTCOME] | "TagOutcomesOfPack" >> tagged(OUTCOME))
    if mix is not None and plan is not None:
        events += _mix_events(mix, plan, read, packed, letters)
    stats = WriteStats(f"{out}/{STATS_FILE}", mix)
    _ = events | "AllEvents" >> beam.Flatten() | "Stats" >> stats
    return temp


def _tokenize_and_pack(
    examples: Any,
    config: PreprocessConfig,
    pad_id: int,
    tokenizer_spec: TokenizerSpec | None,
    spill_dir: str | None,
    mix: MixSources | None,
) -> tuple[Any, Any, tuple[tuple[str, str], ...], Any]:
    """The data kind's tokenize and pack steps: (tokens, packed, the table stages to write as
    (output, file suffix), the mix's plan or None)."""
    if config.data_kind == PREFERENCE_KIND:  # preference_steps: pairs whole, one worker a split
        tokens = examples.examples | "TokenizePairs" >> TokenizePairs(config, mix)
        plan = tokens[MIX_TOKENS] | "PlanMix" >> PlanMix(mix) if mix is not None else None
        pair_packer = DeduplicateAndPackPairs(config.seq_len, pad_id, mix, plan)
        packed = tokens.pairs | "DeduplicateAndPackPairs" >> pair_packer
        return tokens, packed, ((TABLES, ""),), plan
    if config.data_kind == PROMPTS_KIND:  # prompt_steps: one row per prompt record, unpacked
        tokens = examples.examples | "CountPromptTokens" >> CountPromptTokens(config)
        packed = tokens.prompts | "DeduplicateAndWritePrompts" >> DeduplicateAndWritePrompts()
        return tokens, packed, ((TABLES, ""),), None
    tokens = examples.examples | "Tokenize" >> Tokenize(config, tokenizer_spec, spill_dir, mix)
    plan = tokens[MIX_TOKENS] | "PlanMix" >> PlanMix(mix) if mix is not None else None
    packer = DeduplicateAndPack(config.seq_len, pad_id, config.max_open_rows, mix, plan)
    packed = tokens.documents | "DeduplicateAndPack" >> packer
    return tokens, packed, ((TABLES, ""), (TAIL_TABLES, "-tail")), plan


def _mix_events(
    mix: MixSources, plan: Any, read: Any, packed: Any, letters: Sequence[tuple[str, Any, str]]
) -> list[Any]:
    """A mix's stats events: records read per file, the plan, the packing step's per-source
    counts and each dead letter's source (beam_preprocess.mix_steps)."""
    events = [
        read[READ_FILES] | "TagReadFiles" >> tagged(READ_FILES),
        plan | "TagMixPlan" >> beam.Map(plan_event),
        packed[MIX] | "TagMix" >> tagged(MIX),
    ]
    kinds = {DEAD: "rejected", FILTERED: "filtered"}
    for step, results, kind in letters:
        if kind in kinds:
            label = f"Mix{kind.title()}Of{step}"
            events.append(results[kind] | label >> letter_events(mix, kinds[kind]))
    return events


def _read(
    pipeline: beam.Pipeline,
    config: PreprocessConfig,
    bigquery: Sequence[tuple[str, str]],
    mix: MixSources | None = None,
) -> Any:
    """Every input's records and tagged outputs (DEAD, READ, OUTCOME, and READ_FILES: (file or
    table, records)): ReadRecords' own when only files are read, else each output flattened
    over the sources."""
    files = [p for p in config.inputs if is_file_pattern(p)]
    reads = []
    if files or not bigquery:
        reads.append(pipeline | "Read" >> ReadRecords(files, config.input_format))
    for i, (uri, snapshot) in enumerate(bigquery):
        transform = bigquery_source.ReadBigQueryRecords(uri, snapshot, config.bigquery_query)
        table = pipeline | f"ReadBigQuery{i}" >> transform
        prefix = f"{uri}@{snapshot}#"
        counted = table[READ] | f"ReadBigQuery{i}Counts" >> beam.Map(lambda n, p=prefix: (p, n))
        reads.append(
            {**{tag: table[tag] for tag in ("records", DEAD, READ, OUTCOME)}, READ_FILES: counted}
        )
    if len(reads) == 1 and mix is None:
        return reads[0]
    return {
        tag: [r[tag] for r in reads] | f"AllRead{tag.title().replace('_', '')}" >> beam.Flatten()
        for tag in ("records", DEAD, READ, OUTCOME, READ_FILES)
    }


def resolve_sources(
    config: PreprocessConfig,
) -> tuple[PreprocessConfig, list[dict[str, Any]], list[tuple[str, str]]]:
    """Stage hf:// inputs (replaced by their Parquet files) and pin bq:// ones to a snapshot
    time (taken out of the inputs); returns (config, lineage for the manifest, bq inputs)."""
    inputs: list[str] = []
    lineage: list[dict[str, Any]] = []
    bigquery: list[tuple[str, str]] = []
    for uri in config.inputs:
        if is_hf(uri):
            entry = hf_source.stage(uri, config.stage_dir or hf_source.default_stage_dir())
            inputs.append(entry["staged"])
            lineage.append(entry)
        elif is_bigquery(uri):
            snapshot = bigquery[0][1] if bigquery else bigquery_source.snapshot_time()
            lineage.append(bigquery_source.lineage(uri, snapshot, config.bigquery_query))
            bigquery.append((uri, snapshot))
        else:
            inputs.append(uri)
    return replace(config, inputs=tuple(inputs)), lineage, bigquery


class _BySplit(beam.DoFn):
    def process(self, element: tuple[str, Any]) -> Iterator[Any]:
        split, table = element
        yield beam.pvalue.TaggedOutput(split, table)


# -------------------------------------------------------------------------------------- running
