"""The packed-dataset format: directory layout, manifest, row columns, tokenizer identity.

Spelled once, here: Beam writes it, the trainer and evaluation read it (`reader.py`).

A packed dataset is a directory (local path or any fsspec URI such as gs://):

    manifest.json                 see `Manifest`
    train/part-*.parquet          one row = one packed sequence of exactly seq_len tokens
    eval/part-*.parquet
    rejected/part-*.jsonl         dead-letter records: {"source", "record", "reason", "error"}
    filtered/part-*.jsonl         valid records removed by a policy (too long, ...), same format
    eval_records/part-*.jsonl     the clean held-out records ({"prompt", "response"} or {"text"}),
                                  one JSON object per line: exactly the eval split, for generation
    stats.json                    the run's accounting (also written when the run fails)

Row columns (all lists of exactly seq_len integers):
    input_ids      token ids; padding uses the tokenizer's pad id
    loss_mask      1 where the token is a training target, 0 for prompt tokens, padding and the
                   first token of every document (it has no in-document predecessor)
    position_ids   positions that restart at 0 at every document (padding is a segment of its
                   own), so attention and positions never cross a document boundary

Preference datasets (`data_kind` "preference", format minor version 1) add one column:
    pair_ids       which preference document a token belongs to, within its row: 2k+1 for the
                   chosen response of the row's k-th pair, 2k+2 for its rejected one (prompt
                   tokens included), 0 for padding. Both documents of a pair are in the same row.

Prompt datasets (`data_kind` "prompts", minor version 2: GRPO, trainer/grpo/) are not packed: one
row per prompt record (trainer/packed_data/prompts.py):
    record         the record as JSON: "prompt" (text, or chat messages) and every other column
                   of the input unchanged (what the reward functions read, e.g. "answer")
    prompt_tokens  the rendered prompt's length in tokens (at most seq_len)

Versions: `version` is the major version (a reader refuses another one); `minor_version` counts
compatible additions (1: preference datasets, `pair_ids`; 2: prompt datasets). A manifest without `minor_version` is
minor 0 and loads as before; instruction and text datasets are unchanged by minor 1.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from trainer import storage

FORMAT_NAME = "llmft-packed"
FORMAT_VERSION = 1
FORMAT_MINOR_VERSION = 2
"""Compatible additions to FORMAT_VERSION: 1 added preference datasets (the `pair_ids` column),
2 prompt datasets (`data_kind` "prompts")."""
MANIFEST_FILE = "manifest.json"
STATS_FILE = "stats.json"
TRAIN_SPLIT, EVAL_SPLIT = "train", "eval"
SPLITS = (TRAIN_SPLIT, EVAL_SPLIT)
"""Split names, which are also the directories of their Parquet shards."""
REJECTED_DIR = "rejected"
FILTERED_DIR = "filtered"
EVAL_RECORDS_DIR = "eval_records"
COLUMNS = ("input_ids", "loss_mask", "position_ids")
PAIR_COLUMN = "pair_ids"
"""The extra column of preference datasets (see the module docstring)."""
PREFERENCE_KIND = "preference"
"""`data_kind` of a dataset of {prompt, chosen, rejected} pairs (beam_preprocess/preference.py)."""
PROMPTS_KIND = "prompts"
"""`data_kind` of a dataset of prompt records with the columns rewards read (objective grpo)."""
PROMPT_COLUMNS = ("record", "prompt_tokens")
"""The columns of a prompt dataset's rows (see the module docstring)."""
SEQ_LEN_MIN, SEQ_LEN_MAX = 16, 131072
"""Packed row lengths preprocessing, the trainer and the pipeline accept (below 16 a row holds
hardly a prompt; above 128k no supported model has the positions)."""
EVAL_FRACTION_MAX = 0.5
"""Held-out fractions are in [0, EVAL_FRACTION_MAX): more than half held out is a mistake."""
EVAL_FRACTION_DEFAULT = 0.05
"""The held-out fraction when none is given (preprocessing and the pipeline)."""


PARQUET_WRITE_OPTIONS: dict[str, Any] = {"write_page_checksum": True}
"""What every shard writer passes to pyarrow's ParquetWriter: each page carries a CRC32 that the
reader verifies (reader.py), so a shard whose bytes were overwritten fails to read, naming the
shard, instead of training on wrong token ids (the pages are uncompressed: nothing else would
notice)."""


def row_columns(data_kind: str) -> tuple[str, ...]:
    """The row columns of a dataset of this kind: COLUMNS, plus `pair_ids` for preference data."""
    return (*COLUMNS, PAIR_COLUMN) if data_kind == PREFERENCE_KIND else COLUMNS


def table_schema(data_kind: str = "instruction") -> Any:
    """The Parquet schema of train/ and eval/ shards: each column a list<int32> of seq_len values
    (prompt datasets: the record's JSON text and its prompt's token count)."""
    import pyarrow as pa

    if data_kind == PROMPTS_KIND:
        return pa.schema([("record", pa.string()), ("prompt_tokens", pa.int32())])
    return pa.schema([(name, pa.list_(pa.int32())) for name in row_columns(data_kind)])


@dataclass
class TokenizerIdentity:
    """What must match between the tokenizer that packed the data and the one that trains on it."""

    name_or_path: str
    vocab_size: int
    eos_token_id: int | None
    pad_token_id: int | None
    bos_token_id: int | None
    fingerprint: str
    """sha256 of the sorted vocabulary: equal vocabularies give equal fingerprints, wherever they live."""

    @classmethod
    def of(cls, tokenizer: Any) -> TokenizerIdentity:
        """Identity of a Hugging Face tokenizer (duck-typed: no transformers import needed)."""
        vocab = tokenizer.get_vocab()
        digest = hashlib.sha256()
        for token, index in sorted(vocab.items(), key=lambda kv: kv[1]):
            digest.update(f"{index}\t{token}\n".encode())
        return cls(
            name_or_path=str(getattr(tokenizer, "name_or_path", "")),
            vocab_size=len(vocab),
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            fingerprint=digest.hexdigest(),
        )


@dataclass
class SplitInfo:
    rows: int = 0
    documents: int = 0
    tokens: int = 0
    """Non-padding tokens."""
    target_tokens: int = 0
    """Tokens with loss_mask == 1."""
    shards: list[str] = field(default_factory=list)
    """Shard paths relative to the dataset directory."""


@dataclass
class Manifest:
    seq_len: int
    tokenizer: TokenizerIdentity
    data_kind: str
    """"instruction" (prompt/response or chat messages), "text" (plain causal LM),
    "preference" (prompt/chosen/rejected pairs, minor version 1) or "prompts" (prompt records
    with reward columns, minor version 2)."""
    splits: dict[str, SplitInfo]
    stats: dict[str, Any]
    """records_read, kept, rejected, duplicates, filtered {reason: count}; read = kept + filtered
    + duplicates + rejected."""
    format: str = FORMAT_NAME
    version: int = FORMAT_VERSION
    minor_version: int = FORMAT_MINOR_VERSION
    eval_records: list[str] = field(default_factory=list)
    """JSONL files (relative paths) of the eval split's clean records; optional, may be empty."""
    files: list[str] = field(default_factory=list)
    """Every file the run wrote (relative paths, manifest.json aside): what `--overwrite` may
    delete, and nothing else."""
    sources: list[dict[str, Any]] = field(default_factory=list)
    """Lineage of inputs that are not plain files (optional): for hf:// the commit sha read
    ("revision"), for bq:// the "snapshot_time" and the "sql" run."""
    chat_template: str = ""
    """The Jinja chat template that replaced the tokenizer's own ("" for none): the trainer
    exports the tokenizer with it and evaluation renders prompts with it."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        if data.get("format") != FORMAT_NAME:
            raise ValueError(
                f"not a packed dataset manifest (format={data.get('format')!r}, expected "
                f"{FORMAT_NAME!r}): run `llmft preprocess` to produce one"
            )
        if data.get("version") != FORMAT_VERSION:
            raise ValueError(
                f"packed dataset format version {data.get('version')} is not supported "
                f"(this code reads version {FORMAT_VERSION}): re-run `llmft preprocess`"
            )
        return cls(
            seq_len=int(data["seq_len"]),
            tokenizer=TokenizerIdentity(**data["tokenizer"]),
            data_kind=data["data_kind"],
            splits={name: SplitInfo(**info) for name, info in data["splits"].items()},
            stats=data["stats"],
            format=data["format"],
            version=data["version"],
            minor_version=int(data.get("minor_version", 0)),
            eval_records=list(data.get("eval_records", [])),
            files=list(data.get("files", [])),
            sources=list(data.get("sources", [])),
            chat_template=str(data.get("chat_template", "")),
        )


def read_manifest(dataset_dir: str) -> Manifest:
    """Read `manifest.json` from a local or fsspec (gs://, memory://) dataset directory."""
    path = dataset_dir.rstrip("/") + "/" + MANIFEST_FILE
    try:
        with storage.open(path, "r") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ValueError(
            f"no {MANIFEST_FILE} in {dataset_dir!r}: pass the output directory of `llmft preprocess`"
        ) from None
    return Manifest.from_dict(data)


def compatibility_errors(
    manifest: Manifest, tokenizer: TokenizerIdentity, seq_len: int | None
) -> list[str]:
    """Every reason a trainer/evaluator with this tokenizer and seq_len must refuse the dataset."""
    errors = []
    if seq_len is not None and manifest.seq_len != seq_len:
        errors.append(
            f"dataset was packed with seq_len={manifest.seq_len} but seq_len={seq_len} was "
            "requested: set seq_len to match or re-run preprocessing"
        )
    mine, theirs = tokenizer, manifest.tokenizer
    for attr in ("vocab_size", "eos_token_id", "pad_token_id", "fingerprint"):
        if getattr(mine, attr) != getattr(theirs, attr):
            errors.append(
                f"tokenizer mismatch on {attr}: dataset has {getattr(theirs, attr)!r} "
                f"(tokenizer {theirs.name_or_path!r}), model tokenizer has {getattr(mine, attr)!r} "
                f"({mine.name_or_path!r}): preprocess with the model's tokenizer"
            )
    return errors
