"""Where records come from: file patterns, Hugging Face Hub datasets and BigQuery tables.

`--input` takes, besides file patterns (local, globs, gs://, read by beam_preprocess.readers):

- `hf://datasets/ORG/NAME[@REVISION][:SPLIT]` (revision default `main`, split default `train`):
  staged once per resolved commit to Parquet under `--stage-dir` by beam_preprocess.hf_source,
  before Beam starts; the staged files are then read like any Parquet input.
- `bq://PROJECT.DATASET.TABLE`: read by Beam's BigQuery source (beam_preprocess.bigquery_source)
  on Dataflow, pinned to a snapshot time with BigQuery time travel; `--bigquery-query` narrows it.

Either way the manifest's `sources` records exactly what was read (commit sha, snapshot time).
This module only parses and checks; it imports neither Beam nor `datasets`, so the run
parameters' checks (components/params/param_checks.py) use it too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

HF_PREFIX = "hf://datasets/"
BQ_PREFIX = "bq://"
TABLE_PLACEHOLDER = "{table}"
"""Where `--bigquery-query` names the table: replaced by the table pinned at the snapshot time."""

_HF = re.compile(
    r"hf://datasets/(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(@(?P<rev>[\w./-]+?))?(:(?P<split>[\w.-]+))?"
)
_BQ = re.compile(
    r"bq://(?P<project>[a-z][a-z0-9-]{4,28}[a-z0-9])\.(?P<dataset>\w+)\.(?P<table>[\w-]+)"
)


@dataclass(frozen=True)
class HfDataset:
    """A dataset repository on the Hugging Face Hub, at a revision, one split."""

    repo: str
    revision: str = "main"
    split: str = "train"


@dataclass(frozen=True)
class BqTable:
    project: str
    dataset: str
    table: str

    @property
    def sql_name(self) -> str:
        return f"`{self.project}.{self.dataset}.{self.table}`"


def is_hf(uri: str) -> bool:
    return uri.startswith("hf://")


def is_bigquery(uri: str) -> bool:
    return uri.startswith(BQ_PREFIX)


def is_file_pattern(uri: str) -> bool:
    return not (is_hf(uri) or is_bigquery(uri))


def parse_hf(uri: str) -> HfDataset:
    """`hf://datasets/ORG/NAME[@REVISION][:SPLIT]`; ValueError saying what to write otherwise."""
    match = _HF.fullmatch(uri)
    if match is None:
        raise ValueError(
            f"{uri!r} is not a Hugging Face dataset URI: write hf://datasets/ORG/NAME, optionally "
            "with @REVISION (a branch, tag or commit) and :SPLIT, e.g. "
            "hf://datasets/tatsu-lab/alpaca@main:train"
        )
    parts = [*match["repo"].split("/"), *(match["rev"] or "main").split("/"), match["split"] or ""]
    if any(part in (".", "..") for part in parts) or "//" in (match["rev"] or ""):
        # Git refs never hold `..` or empty components (git check-ref-format), repository names
        # neither: as path parts they would reach other repositories' Hub API URLs and cache
        # folders than the one named.
        raise ValueError(
            f"{uri!r}: a repository, revision or split of '.' or '..' (or an empty part) names no "
            "dataset: write hf://datasets/ORG/NAME[@REVISION][:SPLIT]"
        )
    return HfDataset(match["repo"], match["rev"] or "main", match["split"] or "train")


def parse_bigquery(uri: str) -> BqTable:
    """`bq://PROJECT.DATASET.TABLE`; ValueError saying what to write otherwise."""
    match = _BQ.fullmatch(uri)
    if match is None:
        raise ValueError(
            f"{uri!r} is not a BigQuery table URI: write bq://PROJECT.DATASET.TABLE "
            "(narrow it with the bigquery_query option)"
        )
    return BqTable(match["project"], match["dataset"], match["table"])


def snapshot_query(table: BqTable, snapshot_time: str, query: str = "") -> str:
    """The SQL that reads `table` as it was at `snapshot_time` (an RFC 3339 UTC time):
    `query` with `{table}` replaced by the pinned table, or every row."""
    pinned = f"{table.sql_name} FOR SYSTEM_TIME AS OF TIMESTAMP('{snapshot_time}')"
    if not query:
        return f"SELECT * FROM {pinned}"
    return query.replace(TABLE_PLACEHOLDER, pinned)


def source_errors(inputs: tuple[str, ...] | list[str], bigquery_query: str = "") -> list[str]:
    """What is wrong with the inputs' URIs and the BigQuery query, each saying what to change."""
    errors = []
    for uri in inputs:
        try:
            if is_hf(uri):
                parse_hf(uri)
            elif is_bigquery(uri):
                parse_bigquery(uri)
        except ValueError as exc:
            errors.append(str(exc))
    tables = [uri for uri in inputs if is_bigquery(uri)]
    if bigquery_query and not tables:
        errors.append("a BigQuery query is set but no input is a bq://PROJECT.DATASET.TABLE")
    if bigquery_query and TABLE_PLACEHOLDER not in bigquery_query:
        errors.append(
            f"the BigQuery query must name the table as {TABLE_PLACEHOLDER} (it is replaced by "
            "the table pinned at the run's snapshot time, so the run is reproducible)"
        )
    return errors
