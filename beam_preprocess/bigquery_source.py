"""Read a BigQuery table (or a query over it) as records, pinned to a snapshot time.

`ReadBigQueryRecords` wraps Beam's `ReadFromBigQuery` (EXPORT method: a query job into a
temporary table, exported as Avro under the pipeline's temp_location, read in parallel). The SQL
reads the table `FOR SYSTEM_TIME AS OF` the run's snapshot time (beam_preprocess.sources), so a
rerun with the manifest's snapshot time reads the same rows while BigQuery keeps them (time travel:
7 days by default). Rows leave as `{"source": "bq://P.D.T@TIME#<row hash>", "record": {...}}`
with JSON-safe values, like the file readers' records, and the READ count per bundle.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.windowed_value import WindowedValue

from beam_preprocess.records import DEAD, OUTCOME, READ
from beam_preprocess.sources import parse_bigquery, snapshot_query

SNAPSHOT_LAG = datetime.timedelta(minutes=1)
"""How far before the launch the snapshot is taken: BigQuery refuses a time-travel time after its
own clock, and the launcher's clock may run ahead."""


def snapshot_time(now: datetime.datetime | None = None) -> str:
    """The run's snapshot time: RFC 3339 UTC, whole seconds, SNAPSHOT_LAG before `now`."""
    now = now or datetime.datetime.now(datetime.UTC)
    return (now - SNAPSHOT_LAG).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def lineage(uri: str, snapshot: str, query: str = "") -> dict[str, Any]:
    """The manifest's record of what a bq:// input read."""
    return {
        "uri": uri,
        "snapshot_time": snapshot,
        "sql": snapshot_query(parse_bigquery(uri), snapshot, query),
    }


def read_transform(sql: str) -> beam.PTransform:
    """Beam's BigQuery read of `sql` (standard SQL, EXPORT through the pipeline's temp_location;
    the query job runs in the pipeline's --project). INTERACTIVE priority: the pipeline waits
    for the query, and a BATCH query (Beam's default) may queue (same price)."""
    from apache_beam.io.gcp.bigquery import BigQueryQueryPriority

    return beam.io.ReadFromBigQuery(
        query=sql,
        use_standard_sql=True,
        method=beam.io.ReadFromBigQuery.Method.EXPORT,
        query_priority=BigQueryQueryPriority.INTERACTIVE,
    )


class RowsToRecords(beam.DoFn):
    """A BigQuery row -> a record with a stable source; the READ count once per bundle."""

    def __init__(self, uri: str, snapshot: str) -> None:
        self.prefix = f"{uri}@{snapshot}#"

    def start_bundle(self) -> None:
        self.count = 0

    def process(self, row: dict[str, Any]) -> Iterator[dict[str, Any]]:
        self.count += 1
        text = json.dumps(row, default=str, sort_keys=True)  # dates, decimals, bytes as text
        source = self.prefix + hashlib.sha256(text.encode()).hexdigest()[:16]
        yield {"source": source, "record": json.loads(text)}

    def finish_bundle(self) -> Iterator[Any]:
        if self.count:
            yield pvalue.TaggedOutput(READ, WindowedValue(self.count, 0, (GlobalWindow(),)))


class ReadBigQueryRecords(beam.PTransform):
    """bq://P.D.T (pinned at `snapshot`, narrowed by `query`) -> records; tagged outputs DEAD,
    READ and OUTCOME like beam_preprocess.readers.ReadRecords (BigQuery rows are never
    malformed: DEAD and OUTCOME stay empty)."""

    def __init__(self, uri: str, snapshot: str, query: str = "") -> None:
        super().__init__()
        self.uri, self.snapshot = uri, snapshot
        self.sql = snapshot_query(parse_bigquery(uri), snapshot, query)

    def expand(self, pbegin: pvalue.PBegin) -> pvalue.DoOutputsTuple:
        return (
            pbegin
            | "ReadFromBigQuery" >> read_transform(self.sql)
            | "ToRecords"
            >> beam.ParDo(RowsToRecords(self.uri, self.snapshot)).with_outputs(
                DEAD, READ, OUTCOME, main="records"
            )
        )
