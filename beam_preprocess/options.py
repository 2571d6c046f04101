"""Typed options of the preprocessing pipeline, their validation, and the local worker count.

`PreprocessOptions` is a Beam `PipelineOptions` view, so the same flags work on the command line,
in `PipelineOptions(flags)` and on Dataflow workers. `PreprocessConfig.from_options` validates them
once, collecting every mistake into one ValueError, and is what the transforms receive (a small
frozen dataclass that pickles to workers).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from apache_beam.options.pipeline_options import PipelineOptions

from beam_preprocess import data_shape
from beam_preprocess.data_shape import DataShape
from beam_preprocess.mix import TRAIN, resolve_mix
from beam_preprocess.readers import FORMATS
from beam_preprocess.shapes import FIELD_NAMES, Shape, field_error, shape_error
from beam_preprocess.sources import source_errors
from beam_preprocess.template_library import template_error
from beam_preprocess.tokenize import OVERLONG_POLICIES
from trainer.packed_data.format import (
    EVAL_FRACTION_DEFAULT,
    EVAL_FRACTION_MAX,
    PREFERENCE_KIND,
    PROMPTS_KIND,
    SEQ_LEN_MAX,
    SEQ_LEN_MIN,
)

GLOB_CHARS = "*?[]"
"""Characters Beam's file systems read as a pattern: refused in --output, which is matched and
deleted by pattern while the dataset is committed (`out[1]` would fail only after all the work)."""
NORMALIZATIONS = ("NFC", "NFKC", "none")


def add_preprocess_arguments(parser: Any) -> None:
    """The pipeline's own flags (Beam's runner flags such as --runner are parsed by Beam), in the
    order `--help` lists them."""
    add = _adder(parser)
    for group in (_io_arguments, _record_arguments, _cleaning_arguments, _packing_arguments):
        group(add)


def _adder(parser: Any) -> Callable[..., None]:
    """`parser.add_argument` that also accepts each dashed flag's underscored spelling."""

    def add(*names: str, **kwargs: Any) -> None:
        # Dashed and underscored spellings, so both `--seq-len` and Beam-style `--seq_len` work.
        spellings = list(names)
        for name in names:
            other = "--" + name[2:].replace("-", "_") if "-" in name[2:] else None
            if other and other not in spellings:
                spellings.append(other)
        parser.add_argument(*spellings, **kwargs)

    return add


def _io_arguments(add: Callable[..., None]) -> None:
    """Where the records come from and go to, the tokenizer and the row length."""
    add(
        "--input",
        dest="input",
        action="append",
        help="Input file, glob or gs:// pattern; repeat "
        "or comma-separate for several. Formats: .jsonl, .json (array or lines), .csv, .parquet.",
    )
    add("--output", help="Output dataset directory (local or gs://).")
    add(
        "--tokenizer",
        help="Tokenizer: a save_pretrained directory (local or gs://) or hub name "
        "(`llmft preprocess` also takes a .gguf model file).",
    )
    add("--seq-len", dest="seq_len", type=int, default=None, help="Tokens per packed row.")
    add(
        "--input-format",
        dest="input_format",
        default="auto",
        choices=FORMATS,
        help="Input format; auto picks it from each file's suffix.",
    )


def _record_arguments(add: Callable[..., None]) -> None:
    """Which fields hold the text (the data settings, beam_preprocess/data_shape.py), and how
    records are split into train and eval."""
    data_shape.add_arguments(add)
    add(
        "--stage-dir",
        dest="stage_dir",
        default="",
        help="Where hf://datasets/... inputs are staged as Parquet, once per revision (local or "
        "gs://; default: ~/.cache/llmft/staged, which Dataflow workers cannot read).",
    )
    add(
        "--eval-fraction",
        dest="eval_fraction",
        type=float,
        default=EVAL_FRACTION_DEFAULT,
        help="Fraction of records held out for evaluation (by a hash of the prompt/text).",
    )
    add(
        "--split-seed",
        dest="split_seed",
        default="llmft",
        help="Salt of the split hash: change it to draw a different held-out set.",
    )
    add(
        "--train-on-prompt",
        dest="train_on_prompt",
        action="store_true",
        default=False,
        help="Also train on prompt tokens (default: only response tokens are targets).",
    )


def _cleaning_arguments(add: Callable[..., None]) -> None:
    """What is filtered or rejected, and how text is normalised."""
    add(
        "--overlong",
        default="auto",
        choices=("auto", *OVERLONG_POLICIES),
        help="Documents longer than seq-len: drop (filtered), truncate, or split into chunks. "
        "auto: drop for instruction data, split for text.",
    )
    add(
        "--min-chars",
        dest="min_chars",
        type=int,
        default=1,
        help="Filter records with fewer characters (all fields together) after cleaning.",
    )
    add(
        "--max-chars",
        dest="max_chars",
        type=int,
        default=1_000_000,
        help="Filter records with more characters after cleaning (0: no limit).",
    )
    add(
        "--min-tokens",
        dest="min_tokens",
        type=int,
        default=2,
        help="Filter documents with fewer tokens.",
    )
    add("--normalization", default="NFC", choices=NORMALIZATIONS, help="Unicode normalisation.")
    add(
        "--collapse-whitespace",
        dest="collapse_whitespace",
        action="store_true",
        default=False,
        help="Collapse runs of spaces/tabs (off by default: it damages code and tables).",
    )
    add(
        "--max-rejected-fraction",
        dest="max_rejected_fraction",
        type=float,
        default=0.1,
        help="Fail (after writing rejected/) when more than this fraction of records is rejected.",
    )


def _packing_arguments(add: Callable[..., None]) -> None:
    """Packing and tokenizing throughput, and overwriting an existing dataset."""
    add(
        "--pack-groups",
        dest="pack_groups",
        type=int,
        default=16,
        help=(
            "Buckets of the dedup-and-pack shuffle, by content hash: its parallelism; the worker "
            "of a bucket keeps ~300 bytes per record of the bucket to find duplicates, so raise "
            "it for tens of millions of records (leftovers of all buckets are repacked together)."
        ),
    )
    add(
        "--max-open-rows",
        dest="max_open_rows",
        type=int,
        default=2048,
        help="Packing window per group, in rows (memory: this x seq-len tokens per worker).",
    )
    add(
        "--tokenize-batch-size",
        dest="tokenize_batch_size",
        type=int,
        default=2048,
        help="Records per batched tokenizer call.",
    )
    add(
        "--no-chat-template-fast-path",
        dest="chat_fast_path",
        action="store_false",
        default=True,
        help="Render every record with Jinja (the fast path is verified against it anyway).",
    )
    add(
        "--overwrite",
        action="store_true",
        default=False,
        help="Delete an existing dataset in --output first (default: refuse to overwrite).",
    )


class PreprocessOptions(PipelineOptions):
    """Beam view of the pipeline's flags: `PipelineOptions(argv).view_as(PreprocessOptions)`."""

    @classmethod
    def _add_argparse_args(cls, parser: Any) -> None:
        add_preprocess_arguments(parser)


@dataclass(frozen=True, kw_only=True)
class PreprocessConfig(DataShape):
    """Validated settings the transforms run with: the data settings (`DataShape`) and these."""

    inputs: tuple[str, ...]
    """File patterns (local paths, globs, gs://)."""
    output: str
    """Dataset directory; shards go to train/, eval/, dead letters to rejected/ and filtered/."""
    tokenizer: str
    """Tokenizer directory or hub name, loaded once per worker."""
    seq_len: int
    """Tokens per packed row."""
    input_format: str = "auto"
    stage_dir: str = ""
    eval_fraction: float = EVAL_FRACTION_DEFAULT
    """Held-out fraction, decided by a salted hash of the prompt (text), so reruns agree."""
    split_seed: str = "llmft"
    train_on_prompt: bool = False
    overlong: str = "drop"
    """Resolved policy for documents longer than seq_len: drop, truncate or split."""
    min_chars: int = 1
    max_chars: int = 1_000_000
    min_tokens: int = 2
    normalization: str = "NFC"
    collapse_whitespace: bool = False
    max_rejected_fraction: float = 0.1
    pack_groups: int = 16
    max_open_rows: int = 2048
    tokenize_batch_size: int = 2048
    chat_fast_path: bool = True
    overwrite: bool = False

    @classmethod
    def from_options(cls, options: PipelineOptions) -> PreprocessConfig:
        """Validate the parsed flags; every problem is reported in one ValueError."""
        o = options.view_as(PreprocessOptions)
        errors = []
        inputs = tuple(
            p.strip() for value in (o.input or []) for p in value.split(",") if p.strip()
        )
        if not inputs:
            errors.append("--input is required (a file, glob or gs:// pattern)")
        if not o.output:
            errors.append("--output is required (the dataset directory to write)")
        elif any(char in o.output for char in GLOB_CHARS):
            errors.append(
                f"--output {o.output!r} contains a glob character ({' '.join(GLOB_CHARS)}): "
                "choose a directory name without them"
            )
        if not o.tokenizer:
            errors.append("--tokenizer is required (the model's tokenizer directory or name)")
        elif o.tokenizer.lower().endswith(".gguf"):
            errors.append(
                f"--tokenizer {o.tokenizer}: a .gguf file is converted by `llmft preprocess` "
                "(and the pipeline's preprocess step), not by python -m beam_preprocess"
            )
        errors += _range_errors(o)
        if problem := shape_error(o.data_kind, o.record_format):
            errors.append(f"--record-format: {problem}")
        errors += _preference_errors(o)
        if problem := template_error(o.chat_template):
            errors.append(f"--chat-template: {problem}")
        errors += source_errors(inputs, o.bigquery_query)
        errors += _mix_errors(o)
        if o.max_chars and o.max_chars < o.min_chars:
            errors.append(f"--max-chars ({o.max_chars}) is below --min-chars ({o.min_chars})")
        if errors:
            raise ValueError("invalid preprocessing options:\n  - " + "\n  - ".join(errors))
        overlong = o.overlong
        if overlong == "auto":
            overlong = "split" if o.data_kind == "text" else "drop"
        return cls(
            **data_shape.from_options(o),
            inputs=inputs,
            output=o.output.rstrip("/"),
            tokenizer=o.tokenizer,
            seq_len=o.seq_len,
            input_format=o.input_format,
            stage_dir=o.stage_dir,
            eval_fraction=o.eval_fraction,
            split_seed=o.split_seed,
            train_on_prompt=o.train_on_prompt,
            overlong=overlong,
            min_chars=o.min_chars,
            max_chars=o.max_chars,
            min_tokens=o.min_tokens,
            normalization=o.normalization,
            collapse_whitespace=o.collapse_whitespace,
            max_rejected_fraction=o.max_rejected_fraction,
            pack_groups=o.pack_groups,
            max_open_rows=o.max_open_rows,
            tokenize_batch_size=o.tokenize_batch_size,
            chat_fast_path=o.chat_fast_path,
            overwrite=o.overwrite,
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def shape(self) -> Shape:
        """The record shape with every field name resolved."""
        return Shape.of(
            self.data_kind,
            self.record_format,
            prompt=self.prompt_field,
            response=self.response_field,
            messages=self.messages_field,
            text=self.text_field,
            system=self.system_field,
            tool_turns=self.tool_turns,
        )


def _mix_errors(o: Any) -> list[str]:
    """`--train-data-mix`: its form and weights (beam_preprocess.mix), its sources' URIs."""
    entries, problems = resolve_mix(o.train_data_mix, TRAIN)
    if entries and o.data_kind == PROMPTS_KIND:
        problems.append(
            "--train-data-mix: prompt records (--data-kind prompts) cannot be mixed yet"
        )
    others = [p for e in entries if e.uri != TRAIN for p in e.uri.split(",") if p.strip()]
    return problems + source_errors(tuple(others))


def _range_errors(o: Any) -> list[str]:
    """The numeric flags outside their ranges, each with its bounds."""
    errors: list[str] = []
    if o.seq_len is None or not SEQ_LEN_MIN <= o.seq_len <= SEQ_LEN_MAX:
        errors.append(
            f"--seq-len must be an integer in [{SEQ_LEN_MIN}, {SEQ_LEN_MAX}] (got {o.seq_len})"
        )
    if not 0.0 <= o.eval_fraction < EVAL_FRACTION_MAX:
        errors.append(
            f"--eval-fraction must be in [0, {EVAL_FRACTION_MAX}) (got {o.eval_fraction})"
        )
    if not 0.0 <= o.max_rejected_fraction <= 1.0:
        errors.append(f"--max-rejected-fraction must be in [0, 1] (got {o.max_rejected_fraction})")
    for flag, value, low in (
        ("--min-chars", o.min_chars, 0),
        ("--max-chars", o.max_chars, 0),
        ("--min-tokens", o.min_tokens, 1),
        ("--pack-groups", o.pack_groups, 1),
        ("--max-open-rows", o.max_open_rows, 1),
        ("--tokenize-batch-size", o.tokenize_batch_size, 1),
    ):
        if value < low:
            errors.append(f"{flag} must be >= {low} (got {value})")
    return errors


def _preference_errors(o: Any) -> list[str]:
    """Options that have no meaning for preference pairs, refused rather than ignored: the
    pair's shape reads TRL's field names, its prompt is never a target, and a pair longer than
    seq_len is always filtered (a cut response would bias its log-probability)."""
    if o.data_kind != PREFERENCE_KIND:
        return []
    fields = [f"--{name}-field" for name in FIELD_NAMES if getattr(o, f"{name}_field")]
    errors = [problem] if (problem := field_error(o.data_kind, fields)) else []
    if o.train_on_prompt:
        errors.append("--train-on-prompt: the prompt of a pair is never a target")
    if o.overlong not in ("auto", "drop"):
        errors.append(
            f"--overlong {o.overlong}: a pair longer than --seq-len is always filtered (a cut "
            "response would bias its log-probability)"
        )
    return errors


def help_parser(prog: str = "python -m beam_preprocess") -> argparse.ArgumentParser:
    """An argparse parser for --help: the pipeline's flags plus a note on Beam's runner flags."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Preprocess raw records into packed, tokenized Parquet shards + manifest.json.",
        epilog=(
            "Beam runner flags are accepted too, e.g. --runner DataflowRunner --project P "
            "--region R --temp_location gs://... --service_account_email SA "
            "--subnetwork regions/R/subnetworks/S --machine_type n2-standard-8 "
            "--max_num_workers 20 --sdk_container_image IMAGE (or --setup_file ./setup.py); "
            "locally --direct_num_workers N --direct_running_mode multi_processing."
        ),
    )
    add_preprocess_arguments(parser)
    return parser


LOCAL_PROCESSES_MIN_BYTES = 64 * 2**20
LOCAL_PROCESSES_MIN_CORES = 4


def local_workers(input_bytes: int, cores: int) -> int:
    """Beam worker processes for a local run: one per core for inputs of LOCAL_PROCESSES_MIN_BYTES
    and more on machines with LOCAL_PROCESSES_MIN_CORES or more, else one, in this process.

    One process keeps ~2.8 cores busy (the Rust tokenizer's threads work while Python prepares
    and packs), and worker processes cost their start and a data plane through the runner, which
    then holds the whole shuffle besides. On 2 cores one process was faster at 10x the benchmark's
    input too (ratio 1.09 against 0.93 with two processes) and used less memory (2.0 GB against
    2.2 + 1.2 GB): benchmarks/preprocess_bench.py, docs/performance.md.
    """
    small = input_bytes < LOCAL_PROCESSES_MIN_BYTES or cores < LOCAL_PROCESSES_MIN_CORES
    return 1 if small else cores
