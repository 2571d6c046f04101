"""Fakes at the cloud boundary for the deploy tests, and nothing more.

- `FakeKfp`: a KFP v2beta1 REST API on 127.0.0.1 keeping experiments, pipelines, versions, runs
  and recurring runs in memory and recording every request, so the real `kfp.Client` is
  exercised end to end over HTTP.
- `FakeRegistry`: the Artifact Registry KFP upload endpoint (multipart POST, answers
  `<package>/sha256:<digest>`) for the real `kfp.registry.RegistryClient`.
- `FakeVertex`: replaces the methods of the Vertex AI GAPIC service clients (the gRPC boundary)
  and records the request protos the real `aiplatform` SDK builds.
- `service_account_key`: a syntactically real service-account key file, so Application Default
  Credentials load as they would for a user (nothing ever refreshes it: no call leaves the host).
"""

from __future__ import annotations

import email.parser
import hashlib
import http.server
import itertools
import json
import threading
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    body: Any
    files: dict[str, bytes] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)


def _multipart(content_type: str, raw: bytes) -> tuple[dict[str, str], dict[str, bytes]]:
    message = email.parser.BytesParser().parsebytes(
        f"Content-Type: {content_type}\r\n\r\n".encode() + raw
    )
    fields, files = {}, {}
    for part in message.get_payload():  # type: ignore[union-attr]
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        if part.get_filename():
            files[name] = payload
        else:
            fields[name] = payload.decode()
    return fields, files


class _Server:
    """A ThreadingHTTPServer on 127.0.0.1 whose handler calls `self.handle`."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                query = dict(urllib.parse.parse_qsl(url.query))
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                ctype = self.headers.get("Content-Type", "")
                files: dict[str, bytes] = {}
                body: Any = None
                if ctype.startswith("multipart/"):
                    body, files = _multipart(ctype, raw)
                elif raw:
                    body = json.loads(raw)
                rec = Recorded(self.command, url.path, query, body, files, dict(self.headers))
                owner.requests.append(rec)
                status, payload = owner.handle(rec)
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = do_PATCH = _serve

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def handle(self, rec: Recorded) -> tuple[int, Any]:
        raise NotImplementedError

    def __enter__(self) -> _Server:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)

    def calls(self, method: str, path: str) -> list[Recorded]:
        return [r for r in self.requests if r.method == method and r.path == path]


class FakeKfp(_Server):
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
            return 200, {"multi_user": False, "pipeline_store": "kfp"}
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


class FakeRegistry(_Server):
    """Artifact Registry's KFP upload endpoint: `POST <host>` with `content` and `tags`."""

    def handle(self, rec: Recorded) -> tuple[int, Any]:
        if rec.method != "POST" or "content" not in rec.files:
            return 400, {"error": "expected a multipart upload with a content file"}
        package = yaml.safe_load(rec.files["content"])["pipelineInfo"]["name"]
        digest = hashlib.sha256(rec.files["content"]).hexdigest()
        return 200, f"{package}/sha256:{digest}".encode()


def service_account_key(path: Path, project: str = "my-proj") -> Path:
    """Write a service-account key with a fresh RSA key (never sent anywhere)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    path.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": project,
                "private_key_id": "0" * 40,
                "private_key": pem,
                "client_email": f"llmft-deployer@{project}.iam.gserviceaccount.com",
                "client_id": "1" * 21,
                "token_uri": "https://oauth2.googleapis.com/token",
            }
        )
    )
    return path


class FakeVertex:
    """Records the request protos the aiplatform SDK sends to PipelineService and ScheduleService."""

    def __init__(self, monkeypatch: Any) -> None:
        from google.cloud.aiplatform.utils import gcs_utils
        from google.cloud.aiplatform_v1.services.metadata_service import MetadataServiceClient
        from google.cloud.aiplatform_v1.services.pipeline_service import PipelineServiceClient
        from google.cloud.aiplatform_v1.services.schedule_service import ScheduleServiceClient
        from google.cloud.aiplatform_v1.types import (
            Context,
            CreatePipelineJobRequest,
            CreateScheduleRequest,
            MetadataStore,
            PipelineJob,
            PipelineState,
            Schedule,
            UpdateScheduleRequest,
        )

        self.jobs: list[Any] = []  # CreatePipelineJobRequest
        self.schedules: dict[str, Any] = {}  # name -> Schedule
        self.created_schedules: list[Any] = []  # CreateScheduleRequest
        self.updates: list[Any] = []  # UpdateScheduleRequest
        self.calls: list[tuple[str, str]] = []
        self.experiment_children: list[tuple[str, list[str]]] = []
        self.states = ["PIPELINE_STATE_RUNNING", "PIPELINE_STATE_SUCCEEDED"]
        fake = self

        def create_pipeline_job(self: Any, request: Any = None, **kw: Any) -> Any:
            req = (
                CreatePipelineJobRequest(request)
                if request
                else CreatePipelineJobRequest(
                    parent=kw["parent"],
                    pipeline_job=kw["pipeline_job"],
                    pipeline_job_id=kw.get("pipeline_job_id"),
                )
            )
            fake.jobs.append(req)
            job = PipelineJob(req.pipeline_job)
            job.name = f"{req.parent}/pipelineJobs/{req.pipeline_job_id}"
            job.state = PipelineState.PIPELINE_STATE_PENDING
            job.job_detail.pipeline_run_context.name = (
                f"{req.parent}/metadataStores/default/contexts/{req.pipeline_job_id}"
            )
            return job

        def get_pipeline_job(self: Any, request: Any = None, *, name: str, **kw: Any) -> Any:
            job = PipelineJob(fake.jobs[-1].pipeline_job, name=name)
            job.job_detail.pipeline_run_context.name = f"{name}-context"
            state = fake.states.pop(0) if fake.states else "PIPELINE_STATE_SUCCEEDED"
            job.state = PipelineState[state]
            return job

        def create_schedule(self: Any, request: Any = None, **kw: Any) -> Any:
            req = (
                CreateScheduleRequest(request)
                if request
                else CreateScheduleRequest(parent=kw["parent"], schedule=kw["schedule"])
            )
            fake.created_schedules.append(req)
            schedule = Schedule(req.schedule)
            schedule.name = f"{req.parent}/schedules/{len(fake.schedules) + 100}"
            schedule.state = Schedule.State.ACTIVE
            fake.schedules[schedule.name] = schedule
            return schedule

        def list_schedules(self: Any, request: Any = None, **kw: Any) -> Any:
            fake.calls.append(("list_schedules", request.filter))
            wanted = request.filter.partition('"')[2].rstrip('"') if request.filter else None
            return [s for s in fake.schedules.values() if wanted in (None, s.display_name)]

        def update_schedule(self: Any, request: Any = None, **kw: Any) -> Any:
            req = UpdateScheduleRequest(schedule=kw["schedule"], update_mask=kw["update_mask"])
            fake.updates.append(req)
            return req.schedule

        def simple(name: str) -> Any:
            def method(self: Any, request: Any = None, *, name: str = "", **kw: Any) -> None:
                fake.calls.append((method_name, name))
                if name not in fake.schedules:
                    from google.api_core.exceptions import NotFound

                    raise NotFound(f"Schedule {name} not found")

            method_name = name
            return method

        def get_metadata_store(self: Any, request: Any = None, *, name: str, **kw: Any) -> Any:
            return MetadataStore(name=name)

        def get_context(self: Any, request: Any = None, *, name: str, **kw: Any) -> Any:
            return Context(
                name=name, schema_title="system.Experiment", metadata={"experiment_deleted": False}
            )

        def add_context_children(
            self: Any, request: Any = None, *, context: str, child_contexts: list[str], **kw: Any
        ) -> None:
            fake.experiment_children.append((context, list(child_contexts)))

        for cls, name, func in (
            (PipelineServiceClient, "create_pipeline_job", create_pipeline_job),
            (PipelineServiceClient, "get_pipeline_job", get_pipeline_job),
            (ScheduleServiceClient, "create_schedule", create_schedule),
            (ScheduleServiceClient, "list_schedules", list_schedules),
            (ScheduleServiceClient, "update_schedule", update_schedule),
            (ScheduleServiceClient, "pause_schedule", simple("pause_schedule")),
            (ScheduleServiceClient, "resume_schedule", simple("resume_schedule")),
            (ScheduleServiceClient, "delete_schedule", simple("delete_schedule")),
            (MetadataServiceClient, "get_metadata_store", get_metadata_store),
            (MetadataServiceClient, "get_context", get_context),
            (MetadataServiceClient, "add_context_children", add_context_children),
        ):
            monkeypatch.setattr(cls, name, func)
        # PipelineJob.submit creates the pipeline-root bucket through Cloud Storage first.
        monkeypatch.setattr(
            gcs_utils,
            "create_gcs_bucket_for_pipeline_artifacts_if_it_does_not_exist",
            lambda **kw: None,
        )
