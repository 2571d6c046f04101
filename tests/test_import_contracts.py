"""The import contracts of pyproject.toml ([tool.importlinter]) catch what they are written for.

`make lint` runs `lint-imports` on the code as it is. Here each contract is checked against the
real import graph plus one deliberate violation, so a contract that silently stopped matching (a
renamed package, an ignore that is too wide) fails a test instead of passing forever.
"""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path
from typing import Any

import grimp
import pytest
from importlinter.configuration import configure
from importlinter.contracts.acyclic_siblings import AcyclicSiblingsContract
from importlinter.contracts.forbidden import ForbiddenContract
from importlinter.contracts.layers import LayersContract

ROOT = Path(__file__).resolve().parents[1]
CONFIG: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"][
    "importlinter"
]
CONTRACT_TYPES = {
    "layers": LayersContract,
    "forbidden": ForbiddenContract,
    "acyclic_siblings": AcyclicSiblingsContract,
}


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    configure()  # import-linter's adapters (timer, ...), as its CLI sets them up
    return grimp.build_graph(
        *CONFIG["root_packages"],
        include_external_packages=CONFIG["include_external_packages"],
        cache_dir=None,
    )


def _contract(contract_id: str) -> Any:
    (options,) = [c for c in CONFIG["contracts"] if c["id"] == contract_id]
    session = {k: v for k, v in CONFIG.items() if k != "contracts"}
    return CONTRACT_TYPES[options["type"]](
        name=options["name"], session_options=session, contract_options=options
    )


def _check(contract_id: str, graph: grimp.ImportGraph, extra: tuple[str, str] | None = None) -> Any:
    graph = copy.deepcopy(graph)
    if extra is not None:
        graph.add_import(importer=extra[0], imported=extra[1])
    return _contract(contract_id).check(graph, verbose=False)


@pytest.mark.parametrize(
    ("contract_id", "importer", "imported"),
    [
        ("layers", "trainer.train", "beam_preprocess.pipeline"),
        ("layers", "trainer.data", "components.runtime.artifacts"),
        ("layers", "components.runtime.artifacts", "pipelines.cli"),
        ("layers", "beam_preprocess.pipeline", "components.runtime.artifacts"),
        ("layers", "beam_preprocess.pipeline", "trainer.train"),  # only the neutral modules
        ("neutral", "trainer.storage", "torch"),
        ("neutral", "trainer.packed_data.reader", "apache_beam"),
        ("neutral", "trainer.packed_data.format", "transformers"),
        ("neutral", "trainer.packed_data.format", "trainer.config"),
        ("neutral", "trainer.storage", "components.runtime.artifacts"),
        ("evaluation", "components.evaluation.data", "beam_preprocess.records"),
        ("rooms", "components.platform.capacity", "components.params.run_params"),
        ("rooms", "components.runtime.lifeline", "components.launchers.local"),
        ("rooms", "components.params.run_params", "components.preflight.cost"),
        ("rooms", "components.serving.presets", "components.params.param_checks"),
        ("launchers", "components.launchers.base", "components.params.run_params"),
        ("launchers", "components.launchers.pytorchjob", "components.steps.train"),
        ("launchers", "components.etcd.manifests", "components.preflight.cost"),
    ],
)
def test_a_deliberate_violation_breaks_the_contract(
    graph: grimp.ImportGraph, contract_id: str, importer: str, imported: str
) -> None:
    assert _check(contract_id, graph).kept, "the contract must hold on the code as it is"
    assert not _check(contract_id, graph, (importer, imported)).kept


def test_a_cycle_inside_a_package_is_reported(graph: grimp.ImportGraph) -> None:
    before = _check("acyclic", graph).metadata["cycle_breakers_by_package"]
    assert "trainer.packed_data" not in before
    after = _check(
        "acyclic", graph, ("trainer.packed_data.format", "trainer.packed_data.reader")
    ).metadata["cycle_breakers_by_package"]
    assert "trainer.packed_data" in after
