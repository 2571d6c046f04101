"""Kubeflow Pipelines' REST API and Artifact Registry's KFP package endpoint, on loopback.

- `FakeKfp`: a KFP v2beta1 REST API keeping experiments, pipelines, versions, runs and recurring
  runs in memory and recording every request, so the real `kfp.Client` is exercised end to end.
- `FakeRegistry`: the Artifact Registry KFP upload endpoint (multipart POST, answers
  `<package>/sha256:<digest>`) for the real `kfp.registry.RegistryClient`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from typing import Any

import yaml

from fakes.recording import LocalHttpServer, Recorded


class FakeKfp(LocalHttpServer):
    """Just enough of KFP's v2beta1 API for upload, run and recurring runs."""

    API = "/apis/v2beta1"

    def __init__(self) -> None:
        super().__init__()
        self.ids = (f"id-{n}" for n in itertools.count(1))
        self.experiments: dict[str, dict[str, Any]] = {}
        self.pipelines: dict[str, dict[str, Any]] = {}
        self.versions: dict[str, list[dict[str, Any]]] = {}
        self.runs: dict[str, dict[str, Any]] = {}
        self.run_states: list[str] = ["RUNNING", "SUCCEEDED"]
        self.recurring: dict[str, dict[str, Any]] = {}
        self.tag_name = "2.16.0"
        """The release the healthz answer reports (backend/src/apiserver/main.go@2.16.0)."""

    @staticmethod
    def _named(items: list[dict[str, Any]], flt: str | None) -> list[dict[str, Any]]:
        if not flt:
            return items
        wanted = {
            p["key"]: p.get("string_value", p.get("stringValue"))
            for p in json.loads(flt)["predicates"]
        }
        return [i for i in items if all(i.get(k) == v for k, v in wanted.items())]

    def handle(self, rec: Recorded) -> tuple[int, Any]:
        path, q = rec.path.removeprefix(self.API), rec.query
        if path == "/healthz":
            return 200, {
                "commit_sha": "0123abc",
                "tag_name": self.tag_name,
                "multi_user": False,
                "pipeline_store": "kfp",
            }
        if path == "/experiments" and rec.method == "GET":
            found = self._named(list(self.experiments.values()), q.get("filter"))
            return 200, {"experiments": found, "total_size": len(found)}
        if path == "/experiments" and rec.method == "POST":
            exp = {**rec.body, "experiment_id": next(self.ids)}
            self.experiments[exp["experiment_id"]] = exp
            return 200, exp
        if path == "/pipelines" and rec.method == "GET":
            found = self._named(list(self.pipelines.values()), q.get("filter"))
            return 200, {"pipelines": found, "total_size": len(found)}
        if path == "/pipelines/upload":
            pid, vid = next(self.ids), next(self.ids)
            name = q["name"]
            self.pipelines[pid] = {"pipeline_id": pid, "display_name": name}
            self.versions[pid] = [
                {"pipeline_id": pid, "pipeline_version_id": vid, "display_name": name}
            ]
            return 200, self.pipelines[pid]
        if path == "/pipelines/upload_version":
            pid = q["pipelineid"]
            if any(v["display_name"] == q["name"] for v in self.versions[pid]):
                return 409, {"error_message": "version already exists", "code": 6}
            version = {
                "pipeline_id": pid,
                "pipeline_version_id": next(self.ids),
                "display_name": q["name"],
            }
            self.versions[pid].insert(0, version)
            return 200, version
        if path.startswith("/pipelines/") and path.endswith("/versions"):
            found = self.versions.get(path.split("/")[2], [])
            return 200, {
                "pipeline_versions": found[: int(q.get("page_size", 10))],
                "total_size": len(found),
            }
        if path == "/runs" and rec.method == "POST":
            run = {**rec.body, "run_id": next(self.ids), "state": "PENDING"}
            self.runs[run["run_id"]] = run
            return 200, run
        if path.startswith("/runs/") and rec.method == "GET":
            run = self.runs[path.split("/")[2]]
            if self.run_states:
                run["state"] = self.run_states.pop(0)
            return 200, run
        if path == "/recurringruns" and rec.method == "POST":
            rr = {**rec.body, "recurring_run_id": next(self.ids), "status": "ENABLED"}
            self.recurring[rr["recurring_run_id"]] = rr
            return 200, rr
        if path == "/recurringruns" and rec.method == "GET":
            found = self._named(list(self.recurring.values()), q.get("filter"))
            # The real API names this field in camelCase (json_name), unlike the others.
            return 200, {"recurringRuns": found, "total_size": len(found)}
        if path.startswith("/recurringruns/"):
            rr_id, _, verb = path.split("/")[2].partition(":")
            if rr_id not in self.recurring:
                return 404, {"error_message": f"recurring run {rr_id} not found", "code": 5}
            if rec.method == "DELETE":
                del self.recurring[rr_id]
            elif verb:
                self.recurring[rr_id]["mode"] = verb.upper()
            return 200, {}
        return 404, {"error_message": f"no route {rec.method} {rec.path}"}


class FakeRegistry(LocalHttpServer):
    """Artifact Registry's KFP upload endpoint: `POST <host>` with `content` and `tags`."""

    def handle(self, rec: Recorded) -> tuple[int, Any]:
        if rec.method != "POST" or "content" not in rec.files:
            return 400, {"error": "expected a multipart upload with a content file"}
        package = yaml.safe_load(rec.files["content"])["pipelineInfo"]["name"]
        digest = hashlib.sha256(rec.files["content"]).hexdigest()
        return 200, f"{package}/sha256:{digest}".encode()
