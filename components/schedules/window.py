"""What a run's window holds, and how much of it is new since the schedule's last successful run
(the `min_new_records` check of the validate step: an unchanged window spends no GPU).

The window is listed with each file's size and version (object generation on gs://, mtime
locally: trainer/storage.py `file_versions`). A file the last successful run read with the same
size and version holds nothing new; the records of any other file are counted (JSONL and CSV by
lines, Parquet from its footer, JSON arrays parsed), less those the earlier version of that file
held when it grew by appending. A bq:// window is its table's row count and last
modification (table metadata): its new records are the count's growth since the last
successful run. An hf:// window is its dataset's commit at the requested revision (one Hub API
request) and the split's rows when the dataset card declares them: the same commit holds
nothing new; another one counts the declared rows' growth, or, with no declared count (or a
Hub that cannot be asked), cannot be counted before reading, and the run proceeds.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
from typing import Any

from beam_preprocess.sources import parse_bigquery, parse_hf
from trainer import storage

log = logging.getLogger(__name__)


def listable(uri: str) -> bool:
    return bool(uri)


def list_window(uri: str) -> dict[str, dict[str, Any]]:
    """{path: {size, version}} of every file the window's patterns match; a bq:// table as
    {uri: {size: rows, version: last modified, records: rows}}."""
    files: dict[str, dict[str, Any]] = {}
    for pattern in (p.strip() for p in uri.split(",")):
        if pattern.startswith("bq://"):
            files[pattern] = table_version(pattern)
        elif pattern.startswith("hf://"):
            files[pattern] = dataset_version(pattern)
        elif pattern:
            files.update(storage.file_versions(pattern))
    return files


def bigquery_client(project: str) -> Any:
    """The BigQuery client of the window check (a function: tests point it at a fake)."""
    from google.cloud import bigquery

    return bigquery.Client(project=project)


def table_version(uri: str) -> dict[str, Any]:
    """A bq:// table's row count and last modification, from its metadata (no query)."""
    table = parse_bigquery(uri)
    found = bigquery_client(table.project).get_table(
        f"{table.project}.{table.dataset}.{table.table}"
    )
    rows = int(found.num_rows or 0)
    modified = found.modified.isoformat() if found.modified else ""
    return {"size": rows, "version": modified, "records": rows}


HUB_TIMEOUT_S = 20.0
"""One Hub API request's timeout: an unreachable Hub costs the run this long, then it proceeds."""


def hub_api() -> Any:
    """The Hugging Face Hub client of the window check (a function: tests point it at a fake
    Hub). Its token is the environment's (HF_TOKEN), as for staging the dataset."""
    from huggingface_hub import HfApi

    return HfApi()


def dataset_version(uri: str) -> dict[str, Any]:
    """An hf:// dataset's commit at the requested revision and the split's rows the card
    declares (records None: not declared, or the Hub could not be asked: uncountable)."""
    dataset = parse_hf(uri)
    try:
        info = hub_api().dataset_info(
            dataset.repo, revision=dataset.revision, timeout=HUB_TIMEOUT_S
        )
    except Exception as exc:  # the Hub client's HTTP, offline and connection (httpx) errors
        log.warning("could not ask the Hub for %s's commit (%s): counted as changed", uri, exc)
        return {"size": 0, "version": "", "records": None}
    rows = declared_rows(info.card_data.to_dict() if info.card_data else {}, dataset.split)
    return {"size": rows or 0, "version": str(info.sha or ""), "records": rows}


def declared_rows(card: dict[str, Any], split: str) -> int | None:
    """The split's `num_examples` from a dataset card's `dataset_info` (one config, or the
    `default` one of several), None when the card does not say."""
    infos = card.get("dataset_info")
    if isinstance(infos, list):
        infos = next((i for i in infos if i.get("config_name", "default") == "default"), None)
    splits = infos.get("splits", []) if isinstance(infos, dict) else []
    found = next((s.get("num_examples") for s in splits if s.get("name") == split), None)
    return int(found) if isinstance(found, int) else None


def new_records(
    window: dict[str, dict[str, Any]], previous: dict[str, dict[str, Any]]
) -> tuple[int | None, dict[str, dict[str, Any]]]:
    """(records new since `previous`, `window` with the record counts it learnt): unchanged
    files count 0; changed ones their records less the earlier count when known. None: a
    changed entry that cannot be counted before reading (an hf:// dataset at a new commit
    whose card declares no rows): the window is new."""
    total: int | None = 0
    counted = {}
    for path, info in window.items():
        before = previous.get(path)
        if (
            before
            and info["version"]
            and before.get("size") == info["size"]
            and before.get("version") == info["version"]
        ):
            counted[path] = {**info, "records": before.get("records")}
            continue
        records = info["records"] if "records" in info else count_records(path)
        counted[path] = {**info, "records": records}
        if records is None or total is None:
            total = None
            continue
        earlier = before.get("records") if before and info["size"] > before["size"] else None
        total += max(0, records - earlier) if earlier is not None else records
    return total, counted


def count_records(path: str) -> int:
    """Records in one data file (by its suffix), streamed: JSONL and CSV by non-empty lines
    (a CSV's header aside), Parquet from its footer, a JSON array parsed."""
    name = path.lower()
    if name.endswith(".parquet"):
        import pyarrow.parquet as pq

        with storage.open(path, "rb") as f:
            return int(pq.ParquetFile(f).metadata.num_rows)
    with storage.open(path, "rb") as raw:
        stream: Any = gzip.GzipFile(fileobj=raw) if name.endswith(".gz") else raw
        name = name.removesuffix(".gz")
        if name.endswith(".json"):
            data = stream.read()
            if data.lstrip().startswith(b"["):
                return len(json.loads(data))
            return sum(1 for line in data.splitlines() if line.strip())
        lines = sum(1 for line in io.BufferedReader(stream, 1 << 20) if line.strip())
    return max(0, lines - 1) if name.endswith(".csv") else lines
