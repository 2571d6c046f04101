"""What a run's window holds, and how much of it is new since the schedule's last successful run
(the `min_new_records` check of the validate step: an unchanged window spends no GPU).

The window is listed with each file's size and version (object generation on gs://, mtime
locally: trainer/storage.py `file_versions`). A file the last successful run read with the same
size and version holds nothing new; the records of any other file are counted (JSONL and CSV by
lines, Parquet from its footer, JSON arrays parsed), less those the earlier version of that file
held when it grew by appending. A bq:// window is its table's row count and last
modification (table metadata): its new records are the count's growth since the last
successful run. hf:// windows are not compared (their commit is recorded by preprocessing):
such runs always proceed.
"""

from __future__ import annotations

import gzip
import io
import json
from typing import Any

from trainer import storage


def listable(uri: str) -> bool:
    return bool(uri) and not uri.startswith("hf://")


def list_window(uri: str) -> dict[str, dict[str, Any]]:
    """{path: {size, version}} of every file the window's patterns match; a bq:// table as
    {uri: {size: rows, version: last modified, records: rows}}."""
    files: dict[str, dict[str, Any]] = {}
    for pattern in (p.strip() for p in uri.split(",")):
        if pattern.startswith("bq://"):
            files[pattern] = table_version(pattern)
        elif pattern:
            files.update(storage.file_versions(pattern))
    return files


def bigquery_client(project: str) -> Any:
    """The BigQuery client of the window check (a function: tests point it at a fake)."""
    from google.cloud import bigquery

    return bigquery.Client(project=project)


def table_version(uri: str) -> dict[str, Any]:
    """A bq:// table's row count and last modification, from its metadata (no query)."""
    from beam_preprocess.sources import parse_bigquery

    table = parse_bigquery(uri)
    found = bigquery_client(table.project).get_table(
        f"{table.project}.{table.dataset}.{table.table}"
    )
    rows = int(found.num_rows or 0)
    modified = found.modified.isoformat() if found.modified else ""
    return {"size": rows, "version": modified, "records": rows}


def new_records(
    window: dict[str, dict[str, Any]], previous: dict[str, dict[str, Any]]
) -> tuple[int, dict[str, dict[str, Any]]]:
    """(records new since `previous`, `window` with the record counts it learnt): unchanged
    files count 0; changed ones their records less the earlier count when known."""
    total = 0
    counted = {}
    for path, info in window.items():
        before = previous.get(path)
        if (
            before
            and before.get("size") == info["size"]
            and before.get("version") == info["version"]
        ):
            counted[path] = {**info, "records": before.get("records")}
            continue
        records = info["records"] if "records" in info else count_records(path)
        counted[path] = {**info, "records": records}
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
