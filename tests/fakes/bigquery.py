"""BigQuery's REST API (v2), faked over the wire for Beam's `ReadFromBigQuery` (EXPORT method).

No BigQuery emulator installs from PyPI here, so this serves the calls Beam's source makes, in
the shape the service answers them (cloud.google.com/bigquery/docs/reference/rest/v2): a dry-run
query job (its referenced table), the table's location, the temporary dataset (404, then
created), the query job into a temporary table, jobs.get until DONE, the extract job (which here
writes the rows as Avro where the job asks, as BigQuery writes to GCS), the temporary table's
schema, and the temporary dataset's deletion. Every request is recorded; tests compare them with
a reviewed golden file.
"""

from __future__ import annotations

from typing import Any

from fakes.recording import LocalHttpServer, Recorded

BASE = "/bigquery/v2"


class FakeBigQuery(LocalHttpServer):
    """One table (`project.dataset.table`, in `location`) holding `rows` of STRING columns."""

    def __init__(self, table: str, rows: list[dict[str, str]], location: str = "US") -> None:
        super().__init__()
        self.project, self.dataset, self.table = table.split(".")
        self.rows, self.location = rows, location
        self.columns = list(rows[0])
        self.datasets: set[str] = set()
        self.jobs: dict[str, dict[str, Any]] = {}

    def handle(self, rec: Recorded) -> tuple[int, Any]:
        parts = rec.path.removeprefix(BASE).strip("/").split("/")
        # projects/P/jobs[/ID] | projects/P/datasets[/D[/tables/T]]
        kind = parts[2] if len(parts) > 2 else ""
        if kind == "jobs" and rec.method == "POST":
            return self._insert_job(rec.body)
        if kind == "jobs" and rec.method == "GET":
            return 200, self.jobs[parts[3]]
        if kind == "datasets" and rec.method == "POST":
            self.datasets.add(rec.body["datasetReference"]["datasetId"])
            return 200, rec.body
        if kind == "datasets" and len(parts) == 4:
            name = parts[3]
            if rec.method == "DELETE":
                self.datasets.discard(name)
                return 204, b""
            if name in self.datasets or name == self.dataset:
                return 200, {"datasetReference": {"projectId": parts[1], "datasetId": name}}
            return 404, {"error": {"code": 404, "message": f"Not found: Dataset {name}"}}
        if kind == "datasets" and len(parts) == 6 and rec.method == "GET":
            return 200, self._table(parts[1], parts[3], parts[5])
        return 404, {"error": {"code": 404, "message": f"no fake for {rec.method} {rec.path}"}}

    def _table(self, project: str, dataset: str, table: str) -> dict[str, Any]:
        fields = [{"name": c, "type": "STRING", "mode": "NULLABLE"} for c in self.columns]
        return {
            "tableReference": {"projectId": project, "datasetId": dataset, "tableId": table},
            "location": self.location,
            "schema": {"fields": fields},
            "numRows": str(len(self.rows)),
            "lastModifiedTime": str(1_764_590_400_000 + len(self.rows)),  # ms since the epoch
        }

    def _insert_job(self, job: dict[str, Any]) -> tuple[int, Any]:
        config = job["configuration"]
        reference = {**job["jobReference"], "location": self.location}
        done = {
            "id": f"{reference['projectId']}:{self.location}.{reference['jobId']}",
            "jobReference": reference,
            "configuration": config,
            "status": {"state": "DONE"},
        }
        if config.get("dryRun"):
            source = {"projectId": self.project, "datasetId": self.dataset, "tableId": self.table}
            statistics = {"query": {"referencedTables": [source]}, "totalBytesProcessed": "0"}
            return 200, {**done, "statistics": statistics}
        if "extract" in config:
            self._write_avro(config["extract"]["destinationUris"][0])
        self.jobs[reference["jobId"]] = done
        return 200, {**done, "status": {"state": "RUNNING"}}

    def _write_avro(self, uri_pattern: str) -> None:
        """The extract job's output: one Avro file where the job's wildcard URI points."""
        import fastavro
        from apache_beam.io.filesystems import FileSystems

        schema = {
            "type": "record",
            "name": "Root",
            "fields": [{"name": c, "type": ["null", "string"]} for c in self.columns],
        }
        with FileSystems.create(uri_pattern.replace("*", "000000000000")) as f:
            fastavro.writer(f, fastavro.parse_schema(schema), self.rows)


def normalized(requests: list[Recorded]) -> list[dict[str, Any]]:
    """The recorded requests without what differs per run (job ids, temporary names, paths
    under the test's directory), for a golden file."""
    import json
    import re

    text = json.dumps(
        [{"method": r.method, "path": r.path, "query": r.query, "body": r.body} for r in requests]
    )
    for pattern, stand_in in (
        (r"beam_bq_job_(QUERY|EXPORT)_[A-Za-z0-9_-]+", r"beam_bq_job_\1_<id>"),
        (r"beam_temp_(dataset|table)_[0-9a-f]{32}", r"beam_temp_\1_<uuid>"),
        (r'"jobId": "[0-9a-f]{32}"', '"jobId": "<uuid>"'),
        (r'"[^"]*/bigquery-table-dump-[^"]*"', '"<temp_location>/<id>/bigquery-table-dump-*"'),
        (r'"beam_job_name": "[^"]*"', '"beam_job_name": "<job>"'),
    ):
        text = re.sub(pattern, stand_in, text)
    return json.loads(text)
