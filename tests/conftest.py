"""Shared fixtures (the quickstart assets every suite builds on, made once per session), the
golden-file option, the per-test RBAC check of the Kubernetes fakes' requests, and the tiers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

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
def golden(request: pytest.FixtureRequest):
    """`golden.check("name.json", data)`: compare with a reviewed file under tests/golden/."""
    from goldens import Golden

    return Golden(update=request.config.getoption("--update-goldens"))


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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """test_rbac.py last: it compares the golden with what the other tests' fakes observed."""
    items.sort(key=lambda item: item.path.name == "test_rbac.py")
