"""Shared fixtures (the quickstart assets every suite builds on, made once per session), the
golden-file option, the per-test RBAC check of the Kubernetes fakes' requests, and the tiers."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Keep tests offline and quiet, whatever the developer's environment says.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# gcsfs's documented switch to its plain JSON-API filesystem; must be set before gcsfs is imported
# (see tests/gcs_fixtures.py: the default probes a gRPC API that no GCS emulator serves).
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


@pytest.fixture(scope="session")
def sample_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`llmft sample-data` output: train.jsonl, heldout.jsonl, dirty.jsonl, dirty_report.json."""
    from pipelines.quickstart.sample_data import write_sample_data

    out = tmp_path_factory.mktemp("sample_data")
    write_sample_data(out, n_train=4000, n_heldout=400, seed=0)
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, sample_data_dir: Path) -> Path:
    """`llmft tiny-model` output: a ~5M-parameter Llama and its BPE tokenizer with chat template."""
    from pipelines.quickstart.tiny_model import build_tiny_model

    out = tmp_path_factory.mktemp("tiny_model")
    build_tiny_model(out, data_dir=sample_data_dir, vocab_size=4096, hidden_size=256, num_layers=4)
    return out


@pytest.fixture(scope="session")
def gcs_emulator():
    """A GCS emulator for the session; STORAGE_EMULATOR_HOST points every client at it."""
    from gcs_fixtures import start_emulator

    yield from start_emulator()


@pytest.fixture(scope="session", autouse=True)
def subprocess_tmpdir(tmp_path_factory: pytest.TempPathFactory):
    """Give every child process (torchrun agents keep /tmp/torchelastic_* dirs, kfp.local its
    workspaces) a temp dir of the session's own, removed at the end, so tests leave no temp dirs."""
    import shutil
    import tempfile

    tempfile.gettempdir()  # pin this process's own temp dir before TMPDIR changes
    path = tmp_path_factory.mktemp("child_tmp")
    # The local etcd/launcher state root defaults to <tmp>/llmft-runs: pin it so this process and
    # its children (which now see another TMPDIR) agree on where a run's state lives.
    saved = {key: os.environ.get(key) for key in ("TMPDIR", "LLMFT_STATE_DIR")}
    os.environ["LLMFT_STATE_DIR"] = str(path / "llmft-runs")
    os.environ["TMPDIR"] = str(path)
    yield path
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    shutil.rmtree(path, ignore_errors=True)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--rehearsal",
        action="store_true",
        default=False,
        help="run the full gs:// chain (tests/test_gcs_chain.py) instead of its short version",
    )
    parser.addoption(
        "--update-goldens",
        action="store_true",
        default=False,
        help="rewrite tests/golden/ from what the code produces now (review the diff!)",
    )


@pytest.fixture
def fake_registry(monkeypatch: pytest.MonkeyPatch):
    """Vertex Model Registry in memory (project my-project, us-central1) under the real SDK."""
    from fakes.vertex import install_model_registry

    return install_model_registry(monkeypatch, "my-project", "us-central1")


@pytest.fixture
def golden(request: pytest.FixtureRequest):
    """`golden.check("name.json", data)`: compare with a reviewed file under tests/golden/."""
    from goldens import Golden

    return Golden(update=request.config.getoption("--update-goldens"))


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The deploy tests' small stand-in pipeline, compiled per target (tests/deploy_pipeline.py)."""
    from deploy_pipeline import small_templates

    return small_templates(tmp_path_factory.mktemp("templates"))


@pytest.fixture
def kfp_api() -> Iterator[Any]:
    """A fake KFP API server (tests/fakes/kfp_api.py) for the deploy tests."""
    from fakes.kfp_api import FakeKfp

    with FakeKfp() as server:
        yield server


@pytest.fixture(autouse=True)
def _k8s_requests_need_only_reviewed_permissions(request: pytest.FixtureRequest):
    """A Kubernetes API request that needs a permission missing from tests/golden/rbac_permissions.json
    (held against docs/deploy/rbac.yaml by tests/test_rbac.py) fails the test that made it."""
    yield
    k8s_api = sys.modules.get("fakes.k8s_api")
    if k8s_api is None or request.config.getoption("--update-goldens"):
        return
    from goldens import rbac_permissions

    missing = k8s_api.take_unchecked() - rbac_permissions()
    assert not missing, (
        f"the code now needs {sorted(missing)}: grant it in docs/deploy/rbac.yaml and "
        "rerun the suite with --update-goldens (tests/golden/README.md)"
    )


def pytest_sessionfinish(session: pytest.Session) -> None:
    """In update mode, rewrite the RBAC golden from what the Kubernetes fakes were asked for."""
    k8s_api = sys.modules.get("fakes.k8s_api")
    if k8s_api is None or not session.config.getoption("--update-goldens"):
        return
    from goldens import RBAC_PERMISSIONS, RBAC_SOURCES, Golden

    if set(RBAC_SOURCES) <= {item.path.name for item in session.items}:
        Golden(update=True).check(RBAC_PERMISSIONS, sorted(k8s_api.OBSERVED_PERMISSIONS))


TIERS = {
    "unit": (
        "test_artifacts.py", "test_beam_transforms.py", "test_cli_errors.py",
        "test_deploy_config.py", "test_deploy_docs.py", "test_deploy_image.py",
        "test_deploy_kfp.py",
        "test_deploy_vertex.py", "test_evaluate_registry.py", "test_evaluate_units.py",
        "test_evaluate_judge.py", "test_evaluate_gate_tasks.py",
        "test_flex_template.py", "test_infra_from_stack.py", "test_infra_policy.py",
        "test_infra_stack.py", "test_launcher_gke.py", "test_launcher_trainjob.py", "test_launcher_vertex.py",
        "test_pytorchjob_manifest.py", "test_trainjob_manifest.py", "test_rbac.py", "test_secrets.py",
        "test_rendezvous_kubernetes.py", "test_train_step.py", "test_trainer_config.py",
        "test_validation.py", "test_import_contracts.py", "test_packed_data.py",
        "test_dpo.py", "test_memory_model.py", "test_component_source.py", "test_grpo.py",
    ),
    "integration": (
        "test_beam_pipeline.py", "test_compile.py", "test_component_signals.py", "test_gpu.py",
        "test_launcher_local.py", "test_model_families.py", "test_quickstart.py",
        "test_real_model.py", "test_rendezvous_etcd_v3.py", "test_rendezvous_local_etcd.py",
        "test_rendezvous_torchrun.py", "test_storage.py", "test_trainer_data.py",
        "test_trainer_distributed.py", "test_trainer_single.py", "test_qlora.py",
        "test_evaluate_harness.py", "test_evaluate_sharding.py", "test_preference_beam.py",
    ),
    "e2e": (
        "test_deploy_cli.py", "test_deploy_guide.py", "test_evaluate_end_to_end.py",
        "test_gcs_chain.py",
        "test_pipeline_local.py",
    ),
}  # fmt: skip
"""Each test file's tier (docs/testing.md); a test may carry another tier's marker itself.
unit: in process, cloud APIs faked at their boundary; integration: real processes and services
(etcd, torchrun, Beam, the KFP local runner, a GCS emulator); e2e: a user's command end to end."""
_TIER_OF_FILE = {name: tier for tier, names in TIERS.items() for name in names}


@pytest.hookimpl(tryfirst=True)  # before `-m` selects on the markers added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Give every test exactly one tier; run test_rbac.py last (it compares the RBAC golden with
    what the other tests' fakes observed)."""
    for item in items:
        own = {mark.name for mark in item.iter_markers() if mark.name in TIERS}
        if len(own) > 1:
            raise pytest.UsageError(f"{item.nodeid}: more than one tier ({sorted(own)})")
        if not own:
            tier = _TIER_OF_FILE.get(item.path.name)
            if tier is None:
                raise pytest.UsageError(f"{item.path.name}: give it a tier in tests/conftest.py")
            item.add_marker(tier)
    items.sort(key=lambda item: item.path.name == "test_rbac.py")
