"""MLflow tracking of a pipeline run: the run, its nested train/evaluate runs, the model version.

What the steps log (the trainer logs its own curves, trainer/tracking.py):

- one MLflow run per pipeline run, in the experiment `experiment` (the run parameter Vertex
  Experiments uses too; default `llmft`), named after the run id and tagged with it
  (`llmft.run_id`), the base model, the backend, the schedule time and the data (URI, and the
  manifest's Hugging Face commit or BigQuery snapshot time). A retried step finds it by tag.
- a nested run per step (`train`, `evaluate`; tag `mlflow.parentRunId`). The train step creates
  `train` and hands its id to the trainer (`TrainConfig.tracking_run_id`), then logs the run's
  actual cost and its summary; the evaluate step logs base/tuned metrics, the gate's verdict and
  the report and metrics.json as artifacts.
- when the gate passes, a version of the registered model (`registered_model`, else
  `llmft-<base model name>`) whose source is the exported model's URI: MLflow points at it, it
  copies nothing.

A server that fails is a warning, never a failed step: `TrackedRun` methods catch and log.
The token of a server that needs one is read from a secret by name (`tracking_token_secret`:
Secret Manager, or the Kubernetes Secret KFP on GKE mounts as MLFLOW_TRACKING_TOKEN) into MLflow's
own env var; it is never a parameter value. Tests: tests/test_mlflow_tracking.py (a real
`mlflow server`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.runtime.secrets import load_secret_env, secret_problem, secret_version_name
from components.serving.experiments import final_metrics, scalar_params
from trainer import storage
from trainer.tracking import TOKEN_ENV, mlflow_client, redact, tracking_uri_problem

log = logging.getLogger(__name__)

DEFAULT_EXPERIMENT = "llmft"
RUN_ID_TAG = "llmft.run_id"
STEP_TAG = "llmft.step"
PARENT_TAG = "mlflow.parentRunId"
KFP_TRACKING_TOKEN_SECRET = "llmft-mlflow-token"
"""The Kubernetes Secret (key `token`) the KFP-on-GKE pipeline mounts as MLFLOW_TRACKING_TOKEN in
its tasks (optional; fixed when compiling, as the HF token's Secret), and the trainer pods get."""


def local_artifact_location(uri: str) -> str | None:
    """Where a sqlite store's experiment keeps its artifacts: beside the database file
    (`<dir>/mlflow-artifacts`), not MLflow's default ./mlruns in whatever directory the step
    runs in. None for the others (a server has its artifact root; a file: store its own)."""
    if not uri.startswith("sqlite:///"):
        return None
    database = Path(uri.removeprefix("sqlite:///"))
    return (database.parent / "mlflow-artifacts").as_uri() if database.is_absolute() else None


def load_tracking_token(*, project: str, secret: str) -> bool:
    """Put the tracking server's token in MLFLOW_TRACKING_TOKEN (no-op when it is set: KFP on
    GKE mounts the Kubernetes Secret there; or when no secret is named)."""
    return load_secret_env(TOKEN_ENV, project=project, secret=secret)


def tracking_errors(
    uri: str, token_secret: str, *, target: str, project: str, resolve: bool = True
) -> list[str]:
    """What stops tracking before anything starts, beyond RunParams' own checks (the URI's
    scheme): an http(s) host that does not resolve (`resolve`: where the run's steps will
    resolve it, i.e. in the validate step, or here for a local run), and a `tracking_token_secret` that does not exist: on KFP on
    GKE the validate task has the Kubernetes Secret mounted as MLFLOW_TRACKING_TOKEN
    (pipelines/fine_tune.py), elsewhere it is read from Secret Manager in `project`."""
    errors: list[str] = []
    if resolve and tracking_uri_problem(uri, resolve=False) is None:  # (the scheme: RunParams)
        errors += [e for e in [tracking_uri_problem(uri)] if e]
    if target in ("kfp", "vertex") and uri.split(":", 1)[0] in ("file", "sqlite"):
        errors.append(
            f"tracking_uri={uri!r}: a local store on a {target} run is written on each pod's own "
            "disk and lost with it: give an http(s) MLflow server"
        )
    if token_secret and not uri:
        errors.append(f"tracking_token_secret={token_secret!r} without tracking_uri: set both")
    if token_secret and uri and resolve:
        if target == "kfp" and token_secret != KFP_TRACKING_TOKEN_SECRET:
            errors.append(
                f"tracking_token_secret={token_secret!r}: on KFP on GKE the pipeline mounts the "
                f"Kubernetes Secret {KFP_TRACKING_TOKEN_SECRET} (key token): put the token there"
            )
        elif target == "kfp":
            if not os.environ.get(TOKEN_ENV):
                errors.append(
                    f"tracking_token_secret={token_secret!r}: no such Kubernetes Secret (key "
                    "token) in the run's namespace: create it (kubectl create secret generic "
                    f"{token_secret} --from-literal=token=...)"
                )
        elif problem := secret_problem("tracking_token_secret", token_secret, project=project):
            errors.append(problem)
    return errors


def data_tags(dataset_uri: str) -> dict[str, str]:
    """`llmft.data_uri` and, from the packed dataset's manifest, the sources' commits / snapshot
    times (`llmft.data_snapshot`)."""
    tags = {"llmft.data_uri": dataset_uri}
    try:
        manifest = json.loads(storage.read_text(storage.join(dataset_uri, "manifest.json")))
    except (OSError, ValueError):
        return tags
    pins = [
        f"{s.get('uri', '')}@{s.get('revision') or s.get('snapshot_time')}"
        for s in manifest.get("sources") or []
        if s.get("revision") or s.get("snapshot_time")
    ]
    if pins:
        tags["llmft.data_snapshot"] = ", ".join(pins)[:5000]
    return tags


def model_name(registered_model: str, base_model: str) -> str:
    """The MLflow registered model: the run's `registered_model`, else `llmft-<base name>`."""
    if registered_model:
        return registered_model.rsplit("/", 1)[-1]
    base = Path(base_model.rstrip("/")).name.removesuffix(".gguf") or "model"
    return f"llmft-{base}"


@dataclass
class TrackedRun:
    """One pipeline run's MLflow run (found by its `llmft.run_id` tag, or created)."""

    uri: str
    run_id: str
    client: Any
    parent_id: str
    down: bool = False
    """The server did not answer once: later calls are skipped (the step would otherwise wait
    for the client's retries at each one)."""

    @classmethod
    def open(
        cls, uri: str, run_id: str, *, experiment: str = "", tags: Mapping[str, str] | None = None
    ) -> TrackedRun | None:
        """The pipeline run's MLflow run, created when missing; None (with a warning) when the
        server fails: the step goes on untracked."""
        try:
            client = mlflow_client(uri)
            name = experiment or DEFAULT_EXPERIMENT
            found = client.get_experiment_by_name(name)
            exp_id = (
                found.experiment_id
                if found
                else client.create_experiment(name, artifact_location=local_artifact_location(uri))
            )
            runs = client.search_runs(
                [exp_id],
                filter_string=f"tags.`{RUN_ID_TAG}` = '{run_id}' and tags.`{STEP_TAG}` = 'pipeline'",
                max_results=1,
            )
            if runs:
                parent = runs[0].info.run_id
            else:
                all_tags = {RUN_ID_TAG: run_id, STEP_TAG: "pipeline", **dict(tags or {})}
                parent = client.create_run(exp_id, tags=all_tags, run_name=run_id).info.run_id
            for key, value in dict(tags or {}).items():  # a later step may know more (the data)
                client.set_tag(parent, key, value)
        except Exception as exc:
            _warn(uri, "open the run", exc)
            return None
        where = f"{redact(uri)}/#/experiments/{exp_id}/runs/{parent}"
        log.info("tracking to MLflow: %s (%s)", where if uri.startswith("http") else uri, run_id)
        return cls(uri=uri, run_id=run_id, client=client, parent_id=parent)

    def step_run(self, step: str) -> str | None:
        """The nested run of `step` (reused by a retried task); None when the server fails."""
        try:
            runs = self.client.search_runs(
                [self.client.get_run(self.parent_id).info.experiment_id],
                filter_string=f"tags.`{PARENT_TAG}` = '{self.parent_id}' "
                f"and tags.`{STEP_TAG}` = '{step}'",
                max_results=1,
            )
            if runs:
                return str(runs[0].info.run_id)
            experiment = self.client.get_run(self.parent_id).info.experiment_id
            tags = {PARENT_TAG: self.parent_id, STEP_TAG: step, RUN_ID_TAG: self.run_id}
            return str(self.client.create_run(experiment, tags=tags, run_name=step).info.run_id)
        except Exception as exc:
            _warn(self.uri, f"create the {step} run", exc)
            return None

    @contextmanager
    def guarded(self, what: str, *, may_mark_down: bool = True) -> Iterator[None]:
        """Run a logging block; a failing server is a warning (and an unreachable one, `down`).
        An artifact upload never marks it down: it fails apart from the server (a direct gs://
        artifact root the step cannot write, a proxy refusing a large body)."""
        from mlflow.exceptions import RestException

        try:
            yield
        except Exception as exc:
            no_answer = not isinstance(exc, RestException)
            self.down = self.down or (may_mark_down and no_answer)
            _warn(self.uri, what, exc)

    def log(
        self,
        mlflow_run: str,
        *,
        params: Mapping[str, Any] | None = None,
        metrics: Mapping[str, Any] | None = None,
        tags: Mapping[str, str] | None = None,
        artifacts: tuple[str, ...] = (),
        end: bool = False,
    ) -> None:
        """Params, finite metrics, tags and artifact files to `mlflow_run` (best effort)."""
        if self.down:
            return
        from mlflow.entities import Param

        if params:  # apart: write-once params that a retried step changed fail alone
            with self.guarded(f"log params to run {mlflow_run}"):
                values = scalar_params(dict(params or {})).items()
                self.client.log_batch(mlflow_run, params=[Param(k, str(v)) for k, v in values])
        if metrics or tags or artifacts:
            self._log_values(mlflow_run, metrics or {}, tags or {}, artifacts)
        if end and not self.down:
            with self.guarded(f"end run {mlflow_run}"):
                self.client.set_terminated(mlflow_run)

    def _log_values(
        self,
        mlflow_run: str,
        metrics: Mapping[str, Any],
        tags: Mapping[str, str],
        artifacts: tuple[str, ...],
    ) -> None:
        from mlflow.entities import Metric, RunTag

        if self.down:
            return
        with self.guarded(f"log to run {mlflow_run}"):
            self.client.log_batch(
                mlflow_run,
                metrics=[
                    Metric(k, v, _now_ms(), 0) for k, v in final_metrics(dict(metrics)).items()
                ],
                tags=[RunTag(k, str(v)) for k, v in dict(tags).items()],
            )
        for path in artifacts:
            if path and os.path.exists(path) and not self.down:
                with self.guarded(f"upload {os.path.basename(path)}", may_mark_down=False):
                    self.client.log_artifact(mlflow_run, path)

    def register_version(self, name: str, source: str, mlflow_run: str) -> str | None:
        """A new version of registered model `name` whose source is `source` (the exported model's
        URI, not a copy); returns its version, None when the server fails."""
        from mlflow.exceptions import MlflowException

        if self.down:
            return None
        if self.uri.startswith(("http://", "https://")) and not storage.is_remote(source):
            log.warning(
                "MLflow at %s: %s not registered: a tracking server takes only a remote model "
                "URI (gs://...) as a version's source, never a path on this machine (a local "
                "file:/sqlite: tracking store takes one)",
                redact(self.uri),
                source,
            )
            return None
        try:
            try:
                self.client.create_registered_model(name)
            except MlflowException as exc:
                if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise
            version = self.client.create_model_version(
                name, source, run_id=mlflow_run, tags={RUN_ID_TAG: self.run_id}
            )
        except Exception as exc:
            _warn(self.uri, f"register a version of {name}", exc)
            return None
        log.info("MLflow registered model %s version %s -> %s", name, version.version, source)
        return str(version.version)

    def end(self, status: str = "FINISHED") -> None:
        if self.down:
            return
        with self.guarded("end the run"):
            self.client.set_terminated(self.parent_id, status)


def open_step(
    uri: str, run_id: str, step: str, *, experiment: str = "", tags: Mapping[str, str] | None = None
) -> tuple[TrackedRun | None, str]:
    """The pipeline run's MLflow run and `step`'s nested run id ("" untracked: no URI, or the
    server failed, with a warning)."""
    if not uri:
        return None, ""
    tracked = TrackedRun.open(uri, run_id, experiment=experiment, tags=tags)
    if tracked is None:
        return None, ""
    return tracked, tracked.step_run(step) or ""


def open_tracked_step(
    uri: str,
    token_secret: str,
    *,
    project: str,
    run_id: str,
    step: str,
    experiment: str = "",
    tags: Mapping[str, str] | None = None,
) -> tuple[TrackedRun | None, str]:
    """A pipeline step's `open_step`, its token first read from `token_secret` (Secret Manager in
    `project`; on KFP on GKE it is already in the env)."""
    if not uri:
        return None, ""
    load_tracking_token(project=project, secret=token_secret)
    return open_step(uri, run_id, step, experiment=experiment, tags=tags)


def gke_token_env(uri: str, token_secret: str) -> dict[str, str]:
    """The trainer pods' env from Secrets (PyTorchJobOptions.secret_env): the MLflow token from
    the Secret the pipeline's tasks mount too."""
    if not (uri and token_secret):
        return {}
    return {TOKEN_ENV: f"{KFP_TRACKING_TOKEN_SECRET}:token"}


def vertex_token_env(uri: str, token_secret: str, *, project: str) -> dict[str, str]:
    """The Vertex replicas' `CustomJobOptions.secret_env`: the MLflow token's Secret Manager
    version, read by each replica at start (only its name is in the job spec)."""
    if not (uri and token_secret):
        return {}
    return {TOKEN_ENV: secret_version_name(token_secret, project)}


def run_tags(
    *, base_model: str, backend: str, dataset_uri: str, schedule: str = ""
) -> dict[str, str]:
    """The pipeline run's tags: base model, backend, data (URI and pins), schedule time."""
    tags = {"llmft.base_model": base_model, "llmft.backend": backend, **data_tags(dataset_uri)}
    if schedule:
        tags["llmft.schedule_time"] = schedule
    return tags


def finish_train(
    tracked: TrackedRun | None,
    mlflow_run: str,
    *,
    params: Mapping[str, Any],
    metadata: Mapping[str, Any],
    run_dir: str,
) -> None:
    """The run parameters of the step (`params`, to the pipeline's run: the train run has the
    trainer's resolved settings), the train run's summary and actual cost (`gpu_hours`,
    `cost_usd`), the model's URI as a tag, summary.json and cost.json as artifacts; ended."""
    if tracked is None or not mlflow_run:
        return
    files = [storage.join(run_dir, name) for name in ("summary.json", "cost.json")]
    local = tuple(storage.local_path(f) for f in files if not storage.is_remote(f))
    tracked.log(tracked.parent_id, params=params)
    tracked.log(
        mlflow_run,
        metrics=metadata,
        tags={"llmft.model_uri": str(metadata.get("model_uri", ""))},
        artifacts=local,
        end=True,
    )


def finish_evaluate(
    tracked: TrackedRun | None,
    mlflow_run: str,
    *,
    result: Any,
    model_uri: str,
    registered_model: str,
    base_model: str,
) -> str | None:
    """The evaluation's base/tuned metrics, the gate's verdict (metric `gate_passed`, tags
    `llmft.gate` and `llmft.gate_failures`), report.html and metrics.json as artifacts; when the
    gate passed, a registered model version pointing at `model_uri`. Returns that version."""
    if tracked is None or not mlflow_run:
        return None
    failures = "; ".join(result.decision.failures)
    tracked.log(
        mlflow_run,
        metrics={**result.metrics, "gate_passed": 1.0 if result.passed else 0.0},
        tags={
            "llmft.gate": "passed" if result.passed else "failed",
            "llmft.gate_failures": failures,
        },
        artifacts=(result.report_path, result.metrics_path),
        end=True,
    )
    version = None
    if result.passed:
        name = model_name(registered_model, base_model)
        version = tracked.register_version(name, model_uri, mlflow_run)
    # The evaluation is the last tracked step: it ends the pipeline's run.
    tracked.log(
        tracked.parent_id, tags={"llmft.gate": "passed" if result.passed else "failed"}, end=True
    )
    return version


def end_failed(tracked: TrackedRun | None, mlflow_run: str) -> None:
    """Mark a step's run (and the pipeline's) FAILED: the step did not finish."""
    if tracked is not None and mlflow_run and not tracked.down:
        with tracked.guarded("end the run"):
            tracked.client.set_terminated(mlflow_run, "FAILED")
        tracked.end("FAILED")


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)


def _warn(uri: str, what: str, exc: BaseException) -> None:
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    log.warning(
        "MLflow at %s: could not %s (%s: %s); the run goes on untracked there",
        redact(uri),
        what,
        type(exc).__name__,
        first,
    )
