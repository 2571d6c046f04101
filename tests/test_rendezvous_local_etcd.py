"""Local etcd lifecycle and the etcd_up / etcd_down step, with the real etcd binary.

The start and the stop run in different processes, as in the pipeline (the `etcd_up` task exits
while etcd keeps running; cleanup stops it later by run id).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import requests
from fakes.k8s_api import KubeApiServer

from components.etcd import kubernetes as k8s_etcd
from components.etcd import local as etcd_local
from components.etcd import manifests as etcd_manifests
from components.params.step_params import request_of
from components.steps import etcd as etcd_step
from components.steps.cleanup import COMPONENT as CLEANUP_STEP
from components.steps.cleanup import run as cleanup

REPO = Path(__file__).resolve().parents[1]
needs_etcd = pytest.mark.skipif(not etcd_local.shutil.which("etcd"), reason="etcd not installed")


def _in_subprocess(code: str, env: dict[str, str]) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def _pid_alive(pid: int) -> bool:
    return etcd_local._alive(pid)


@needs_etcd
def test_detached_etcd_outlives_its_starter_and_stops_from_another_process(tmp_path: Path) -> None:
    run_id = f"Local Run/{uuid.uuid4().hex[:6]}"  # not DNS-safe on purpose: state dir is sanitised
    env = {"LLMFT_STATE_DIR": str(tmp_path)}  # read at call time, in each process
    endpoint = _in_subprocess(
        f"from components.etcd import local; print(local.start({run_id!r}, detached=True))",
        env,
    )
    state_path = etcd_local.state_file(run_id, tmp_path)
    info = json.loads(state_path.read_text())
    assert endpoint == info["endpoint"] and endpoint.startswith("127.0.0.1:")
    # The starter has exited; etcd still serves, v3 only.
    assert requests.get(f"http://{endpoint}/health", timeout=5).json()["health"] == "true"
    assert requests.get(f"http://{endpoint}/v2/keys", timeout=5).status_code == 404
    assert os.getsid(info["pid"]) == info["pid"]  # its own session: immune to the task's signals
    assert Path(info["data_dir"]).is_dir()

    stopped = _in_subprocess(
        f"from components.etcd import local; print(local.stop({run_id!r}))", env
    )
    assert stopped == "True"
    assert not _pid_alive(info["pid"])
    assert not Path(info["data_dir"]).exists()
    assert not state_path.parent.exists()
    assert etcd_local.stop(run_id, root=tmp_path) is False  # nothing left: a no-op


@needs_etcd
def test_start_is_idempotent_and_v2_is_optional(tmp_path: Path) -> None:
    run_id = f"idem-{uuid.uuid4().hex[:6]}"
    try:
        first = etcd_local.start(run_id, root=tmp_path, enable_v2=True)
        assert etcd_local.start(run_id, root=tmp_path, enable_v2=True) == first  # a retried task
        assert requests.get(f"http://{first}/v2/keys", timeout=5).status_code == 200
        status = etcd_local.status(run_id, root=tmp_path)
        assert status is not None and status.enable_v2 and not status.detached
    finally:
        assert etcd_local.stop(run_id, root=tmp_path)
    assert etcd_local.status(run_id, root=tmp_path) is None


def test_missing_binary_says_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no etcd on it
    with pytest.raises(etcd_local.EtcdNotFoundError) as info:
        etcd_local.start("no-etcd", root=tmp_path)
    message = str(info.value)
    assert "apt-get install etcd-server" in message and "--rdzv-backend c10d" in message
    assert isinstance(info.value, ValueError)  # the CLI reports it as a one-line user error
    assert not etcd_local.state_file("no-etcd", tmp_path).exists()


def test_state_root_env_is_read_at_call_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMFT_STATE_DIR", str(tmp_path / "a"))
    assert etcd_local.state_file("r1") == tmp_path / "a" / "r1" / "etcd.json"
    monkeypatch.setenv("LLMFT_STATE_DIR", str(tmp_path / "b"))
    assert etcd_local.state_file("r1") == tmp_path / "b" / "r1" / "etcd.json"
    assert etcd_local.state_file("r1", tmp_path / "c") == tmp_path / "c" / "r1" / "etcd.json"


# -- the etcd step, and cleanup ---------------------------------------------------------------------


def etcd_up(**values: Any) -> etcd_step.EtcdRequest:
    """The etcd step's request with the component's defaults for what a test leaves out."""
    component = {"rdzv_backend": "etcd-v3", "namespace": "", "gke_cluster": ""}
    return request_of(etcd_step.COMPONENT, **component | values)


@needs_etcd
def test_step_local_up_and_down(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMFT_STATE_DIR", str(tmp_path))
    run_id = f"step-{uuid.uuid4().hex[:6]}"
    endpoint = etcd_step.run(etcd_up(backend="local", run_id=run_id))
    try:
        assert requests.get(f"http://{endpoint}/health", timeout=5).json()["health"] == "true"
        assert etcd_local.status(run_id).detached  # type: ignore[union-attr]
    finally:
        removed = cleanup(request_of(CLEANUP_STEP, backend="local", run_id=run_id))
    assert removed == [f"stopped the local etcd of run {run_id}"]
    assert cleanup(request_of(CLEANUP_STEP, backend="local", run_id=run_id)) == []


def test_step_needs_no_etcd_for_vertex_or_c10d(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
    assert etcd_step.run(etcd_up(backend="vertex", run_id="r")) == ""
    assert "c10d at the primary replica" in caplog.text
    assert (
        etcd_step.run(etcd_up(backend="gke", run_id="r", namespace="ns", rdzv_backend="c10d")) == ""
    )


def test_step_reports_all_config_errors() -> None:
    with pytest.raises(ValueError) as info:
        etcd_step.run(etcd_up(backend="gke", run_id="r", rdzv_backend="zookeeper"))
    assert "rdzv_backend='zookeeper'" in str(info.value) and "namespace is empty" in str(info.value)
    with pytest.raises(ValueError, match="backend='k8s'"):
        etcd_step.run(etcd_up(backend="k8s", run_id="r"))


def test_step_gke_creates_waits_and_deletes() -> None:
    run_id, ns = "gke-run-1", "training"
    name = etcd_manifests.etcd_name(run_id)

    def respond(method: str, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        if method == "POST":  # the API server assigns every object a uid
            return 201, {**body, "metadata": {**body["metadata"], "uid": f"uid-{len(path)}"}}
        if path.endswith(f"/statefulsets/{name}/status"):
            return 200, {"kind": "StatefulSet", "status": {"replicas": 1, "readyReplicas": 1}}
        if method == "GET":
            return 200, {"kind": "List", "items": [{"metadata": {"name": name}}]}
        return 200, {"kind": "Status", "status": "Success"}

    server = KubeApiServer(respond)
    try:
        endpoint = etcd_step.run(
            etcd_up(
                backend="gke",
                run_id=run_id,
                namespace=ns,
                rdzv_backend="etcd-v2",
                storage_class="premium-rwo",
                api_client=server.api_client,
            )
        )
        assert endpoint == f"{name}.{ns}.svc.cluster.local:2379"
        sts = next(r.body for r in server.requests if r.path.endswith("/statefulsets"))
        assert "--enable-v2=true" in sts["spec"]["template"]["spec"]["containers"][0]["command"]
        assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"] == "premium-rwo"
        removed = k8s_etcd.delete_etcd(server.api_client, run_id=run_id, namespace=ns)
        assert removed == [
            f"StatefulSet/{name}",
            f"Service/{name}",
            f"NetworkPolicy/{name}",
            f"PersistentVolumeClaim/{name}",
        ]
    finally:
        server.close()
