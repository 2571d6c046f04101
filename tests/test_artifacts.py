"""Why components pass data artifacts by `.uri` and write their own small outputs to `.path`.

On Vertex AI and KFP on GKE an artifact's URI is gs://, and `.path` is the same object as
`/gcs/<bucket>/...`: a Cloud Storage FUSE mount that exists in Vertex tasks but not in a GKE pod,
a Dataflow worker or a trainer replica. Under kfp.local the URI is a local path and `.path` is the
same string. So `.uri` names the data the same way for every process on every target (storage
reaches gs:// through the GCS API), while `.path` is only right inside the component's own task.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
from kfp import dsl

from components import kfp_components
from components.runtime.artifacts import data_artifact_uri
from trainer import storage


@pytest.mark.integration  # the GCS emulator
def test_cloud_artifact_uri_is_reachable_everywhere_path_only_through_a_mount(
    gcs_emulator,
) -> None:
    bucket = gcs_emulator.create_bucket("artifacts-test")
    dataset = dsl.Dataset(uri=f"{bucket}/pipeline_root/run-1/preprocess/dataset")
    assert dataset.path == "/gcs/artifacts-test/pipeline_root/run-1/preprocess/dataset"
    # A worker (trainer replica, Dataflow, this test process) reads and writes the URI ...
    storage.write_text(storage.join(dataset.uri, "manifest.json"), "{}")
    assert storage.read_text(storage.join(dataset.uri, "manifest.json")) == "{}"
    # ... while the /gcs path means nothing without a FUSE mount (GKE pods, Dataflow, here).
    assert not Path(dataset.path).exists()


def test_local_artifact_uri_and_path_are_the_same_directory(tmp_path: Path) -> None:
    model = dsl.Model(uri=str(tmp_path / "train" / "model"))
    assert model.path == model.uri
    assert not storage.is_remote(model.uri)


def test_components_pass_data_by_uri_and_write_reports_to_path() -> None:
    from components import steps
    from components.steps import cleanup, etcd, evaluate, preprocess, register, train, validate

    modules = (
        kfp_components,
        steps,
        validate,
        preprocess,
        etcd,
        train,
        evaluate,
        register,
        cleanup,
    )
    source = "".join(inspect.getsource(module) for module in modules)
    by_uri = set(re.findall(r"(\w+)\.uri\b", source))
    by_path = set(re.findall(r"(\w+)\.path\b", source)) - {"os"}
    assert {"dataset", "model", "tuned_model"} <= by_uri
    assert by_path == {"summary", "report"}
    assert not by_uri & by_path, "an artifact is used through both .uri and .path"


def test_local_run_with_remote_work_uri_puts_data_artifacts_on_gcs(tmp_path: Path) -> None:
    local = str(tmp_path / "pipeline_root" / "preprocess" / "dataset")
    assert (
        data_artifact_uri(local, work_uri="gs://b/work", run_id="run-1", name="dataset")
        == "gs://b/work/runs/run-1/dataset"
    )
    assert data_artifact_uri(local, work_uri="", run_id="r", name="dataset") == local
    assert data_artifact_uri(local, work_uri=str(tmp_path), run_id="r", name="d") == local
    cloud = "gs://root/run/preprocess/dataset"
    assert data_artifact_uri(cloud, work_uri="gs://b/work", run_id="r", name="dataset") == cloud
