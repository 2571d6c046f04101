"""Shared fixtures (the quickstart assets every suite builds on, made once per session), the
golden-file option, the per-test RBAC check of the Kubernetes fakes' requests, and the tiers."""

from __future__ import annotations

import os
import platform
import re
import sys
from collections.abc import Iterator
from itertools import combinations
from pathlib import Path
from typing import Any

import pytest
import unit_guard
from goldens import RBAC_SOURCES

# Keep tests offline and quiet, whatever the developer's environment says.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# gcsfs's documented switch to its plain JSON-API filesystem; must be set before gcsfs is imported
# (see tests/gcs_fixtures.py: the default probes a gRPC API that no GCS emulator serves).
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
# MLflow's telemetry schema calls platform.platform() when imported, which runs `uname -p` once
# per process (then cached): done here, so a unit test whose first import of MLflow comes late
# (TRL's, in test_grpo.trl_grpo) starts no process (tests/unit_guard.py).
platform.processor()
# Under `pytest -n 2` (make test) two workers share 2 cores: one intra-op thread each (and in
# the children they start), as more threads than free cores make every torch op wait on the
# slowest thread. Set before any test module imports torch.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# The pipeline's KFP components, imported first: KFP's decorators and tasks call inspect, whose
# search for a frame's module walks all of sys.modules, so importing them late in a worker that
# has loaded torch, TRL and Pulumi took 12 s of CPU instead of 2.8 s (this 2-core machine).
import pipelines.compile  # noqa: E402, F401


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


def pytest_configure(config: pytest.Config) -> None:
    unit_guard.install()
    if config.getoption("--update-goldens") and getattr(config.option, "numprocesses", None):
        # each worker would write the RBAC golden from its own share of the tests
        raise pytest.UsageError("--update-goldens needs one process: drop -n")


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest):
    """Remember what each fixture starts (tests/unit_guard.py), whichever tier set it up."""
    with unit_guard.fixture_setup(_fixture_key(fixturedef)):
        return (yield)


def _fixture_key(fixturedef: pytest.FixtureDef) -> str:
    """A fixture by its definition: two modules may each define their own `endpoint`."""
    return f"{fixturedef.baseid}::{fixturedef.argname}" if fixturedef.baseid else fixturedef.argname


def _fixture_keys(item: pytest.Item) -> list[str]:
    """The definitions of the fixtures a test uses (the closest one of each name)."""
    defs = getattr(item, "_fixtureinfo", None)
    return [_fixture_key(d[-1]) for d in (defs.name2fixturedefs.values() if defs else ()) if d]


def _unit(item: pytest.Item) -> bool:
    return item.get_closest_marker("unit") is not None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    """The unit tier's rule (tests/unit_guard.py): a unit test, its fixtures included, starts no
    process and binds no socket. A hook around setup, call and teardown rather than an autouse
    fixture: a fixture runs after the session and module fixtures it would have to watch."""
    if not _unit(item):
        return (yield)
    unit_guard.begin(item.nodeid, _fixture_keys(item))
    result = yield
    if message := unit_guard.failure():
        pytest.fail(message, pytrace=False)
    unit_guard.phase("call")
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    result = yield
    if _unit(item) and (message := unit_guard.failure()):
        pytest.fail(message, pytrace=False)  # the test swallowed the guard's own failure
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    if not _unit(item):
        return (yield)
    before = unit_guard.seen_count()
    unit_guard.phase("teardown")
    try:
        result = yield
    finally:
        started_now = unit_guard.seen_count() > before
        message = unit_guard.failure()
        unit_guard.end()
    if started_now and message:
        pytest.fail(message, pytrace=False)
    return result


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


@pytest.fixture(autouse=True)
def _unit_tests_size_no_remote_model(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
):
    """A unit test's GKE launch never reads a gs:// base model's config.json over the network (the
    train step sizes the pods' ephemeral storage from it: tests/test_node_setup.py tests that on
    local files); gcsfs would retry an unreachable bucket for minutes."""
    if request.node.get_closest_marker("unit") is None:
        return
    import components.steps.train_gke as train_gke

    real = train_gke.weight_bytes
    monkeypatch.setattr(
        train_gke,
        "weight_bytes",
        lambda base_model: None if "://" in base_model else real(base_model),
    )


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
    "test_artifacts.py": "unit",
    "test_beam_pipeline.py": "integration",
    "test_beam_transforms.py": "unit",
    "test_mix.py": "unit",
    "test_mix_pipeline.py": "integration",
    "test_schedules.py": "unit",
    "test_schedule_history_page.py": "integration",
    "test_schedule_drift.py": "integration",
    "test_cli_errors.py": "unit",
    "test_compile.py": "integration",
    "test_component_signals.py": "integration",
    "test_deploy_cli.py": "e2e",
    "test_deploy_config.py": "unit",
    "test_deploy_docs.py": "unit",
    "test_deploy_guide.py": "e2e",
    "test_deploy_image.py": "unit",
    "test_deploy_kfp.py": "integration",
    "test_deploy_vertex.py": "unit",
    "test_dpo.py": "unit",
    "test_evaluate_end_to_end.py": "e2e",
    "test_evaluate_gate_tasks.py": "unit",
    "test_evaluate_harness.py": "integration",
    "test_evaluate_judge.py": "unit",
    "test_evaluate_registry.py": "unit",
    "test_evaluate_sharding.py": "integration",
    "test_evaluate_units.py": "unit",
    "test_flex_template.py": "unit",
    "test_gcs_chain.py": "e2e",
    "test_gpu.py": "integration",
    "test_import_contracts.py": "unit",
    "test_infra_from_stack.py": "unit",
    "test_infra_policy.py": "unit",
    "test_infra_stack.py": "unit",
    "test_launcher_gke.py": "unit",
    "test_launcher_local.py": "integration",
    "test_launcher_vertex.py": "unit",
    "test_local_progress.py": "unit",
    "test_memory_model.py": "unit",
    "test_model_families.py": "integration",
    "test_packed_data.py": "unit",
    "test_pipeline_local.py": "e2e",
    "test_preference_beam.py": "integration",
    "test_prompts_beam.py": "integration",
    "test_grpo_trainer.py": "integration",
    "test_grpo_params.py": "unit",
    "test_pytorchjob_manifest.py": "unit",
    "test_qlora.py": "integration",
    "test_quickstart.py": "integration",
    "test_rbac.py": "unit",
    "test_real_model.py": "integration",
    "test_rendezvous_etcd_v3.py": "integration",
    "test_rendezvous_kubernetes.py": "unit",
    "test_rendezvous_local_etcd.py": "integration",
    "test_rendezvous_torchrun.py": "integration",
    "test_secrets.py": "unit",
    "test_storage.py": "integration",
    "test_train_fit.py": "unit",
    "test_train_step.py": "unit",
    "test_unit_guard.py": "unit",
    "test_trainer_config.py": "unit",
    "test_trainer_data.py": "integration",
    "test_trainer_distributed.py": "integration",
    "test_trainer_single.py": "integration",
    "test_validation.py": "unit",
    "test_component_source.py": "unit",
    "test_tracking_units.py": "unit",
    "test_quota.py": "unit",
    "test_node_setup.py": "unit",
    "test_launcher_trainjob.py": "unit",
    "test_trainjob_manifest.py": "unit",
    "test_mlflow_tracking.py": "integration",
    "test_grpo.py": "unit",
    "test_grpo_vllm.py": "unit",
}
"""Each test file's tier (docs/testing.md), one line per file; a test may carry another tier's
marker itself (a file that mixes tiers marks its tests), and a file that marks all its tests
itself (`pytestmark`) needs no line. The tier is what a test starts:
unit: runs in one process: no subprocess, no server, no port bound, no Beam pipeline run, no torch
process group (enforced: tests/unit_guard.py); integration: real processes and services (etcd,
torchrun, Beam, the KFP local runner, a GCS emulator, loopback fakes); e2e: a user's command end
to end."""
TIER_NAMES = ("unit", "integration", "e2e")


WORKER_GROUPS = {
    # test_rbac.py compares the golden with what the Kubernetes fakes saw in its own process.
    **dict.fromkeys((*RBAC_SOURCES, "test_rbac.py"), "rbac"),
    # The first Pulumi mock stack in a process imports the providers' modules it touches (about
    # 10 s of CPU on this 2-core machine): one worker pays it, not both.
    **dict.fromkeys(
        ("test_infra_stack.py", "test_infra_policy.py", "test_infra_from_stack.py",
         "test_deploy_docs.py"), "pulumi"),
    # The same for TRL's import (test_grpo.trl_grpo).
    **dict.fromkeys(("test_grpo.py", "test_grpo_vllm.py"), "trl"),
}  # fmt: skip
"""Files whose tests share one worker under `pytest -n 2 --dist loadgroup`, by file name."""


def pytest_itemcollected(item: pytest.Item) -> None:
    """Each file of `WORKER_GROUPS` joins its group (test_rbac.py also runs last: below).
    (Marked here, as each test is collected: xdist reads the group in its own
    collection_modifyitems, which may run before ours.)"""
    if group := WORKER_GROUPS.get(item.path.name):
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.hookimpl(specname="pytest_collection_modifyitems", trylast=True)
def pytest_collection_modifyitems_xdist_groups(
    config: pytest.Config, items: list[pytest.Item]
) -> None:
    """What `--dist loadgroup` does to a test marked xdist_group (and, here, to every integration
    and e2e test: its file is its group): its group as a suffix of its node id (the scheduler sends one suffix to one worker). pytest-xdist 3.8's own hook writes the
    suffix where pytest 9.2 no longer reads a node id (checked: `-n 2 --dist loadgroup` split a
    marked group across workers), so it is done here. Drop this once xdist writes `_id`."""
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        groups = {str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                  for m in item.iter_markers("xdist_group")}  # fmt: skip
        if not groups and item.get_closest_marker("unit") is None:
            # A process-heavy file runs on one worker: its module fixtures (a trained run, a
            # started service) are built once, and a chain of dependent tests (test_gcs_chain.py)
            # stays in order. Unit tests spread freely.
            groups = {item.nodeid.split("::", 1)[0]}
        if groups and "@" not in item.nodeid:
            # pytest 9 keeps the id in `_id` (a NodeId); xdist 3.8 still writes `_nodeid`.
            from _pytest.nodeid import coerce_node_id

            item._id = coerce_node_id(f"{item.nodeid}@{'_'.join(sorted(groups))}")


_MARK_NAME = re.compile(r"\bmark\.(\w+)")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under `-m`, a test file none of whose tests can be selected is not imported.

    `make test-fast` (`-m 'unit and not gpu'`) then never imports the integration files and what
    they import (9 of its 43 seconds of collection on this 2-core machine). A test in the file
    carries at most its file's tier (`TIERS`) and the marks its source names (`mark.<name>`), so
    the file is skipped only when no combination of those satisfies the expression."""
    expression = config.option.markexpr
    name = collection_path.name
    if not expression or not (name.startswith("test_") and name.endswith(".py")):
        return None
    from _pytest.mark.expression import Expression

    marks = set(_MARK_NAME.findall(collection_path.read_text()))
    if name in TIERS:
        marks.add(TIERS[name])
    compiled = Expression.compile(expression)
    for size in range(len(marks) + 1):
        for chosen in combinations(sorted(marks), size):
            if compiled.evaluate(lambda mark, chosen=chosen, **_: mark in chosen):
                return None
    return True


@pytest.hookimpl(tryfirst=True)  # before `-m` selects on the markers added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Give every test exactly one tier; run test_rbac.py last (it compares the RBAC golden with
    what the other tests' fakes observed)."""
    for item in items:
        own = {mark.name for mark in item.iter_markers() if mark.name in TIER_NAMES}
        if len(own) > 1:
            raise pytest.UsageError(f"{item.nodeid}: more than one tier ({sorted(own)})")
        if not own:
            tier = TIERS.get(item.path.name)
            if tier is None:
                raise pytest.UsageError(f"{item.path.name}: give it a tier in tests/conftest.py")
            item.add_marker(tier)
    items.sort(key=lambda item: item.path.name == "test_rbac.py")
