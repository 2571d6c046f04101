"""The import contracts of pyproject.toml ([tool.importlinter]) catch what they are written for.

`make lint` runs `lint-imports` on the code as it is. Here each contract is checked against the
real import graph plus one deliberate violation, so a contract that silently stopped matching (a
renamed package, an ignore that is too wide) fails a test instead of passing forever.
"""

from __future__ import annotations

import ast
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


GKE_TRAIN_STEP = ("components.steps.train", "components.steps.train_gke")
"""What a GKE launch of the train step imports: the shared step and its GKE module."""
OTHER_BACKENDS = ("components.steps.train_vertex", "components.steps.train_local")
"""The other backends' step modules: the train step imports each only when it is the chosen one."""
GKE_TRAIN_CLOSURE_MAX = 48
"""Project modules a GKE launch of the train step may import (module- and function-level
imports): 70 before the per-backend split, 52 after it, 54 with GRPO (TrainConfig checks its
rewards), 48 since a step holds its own generated parameter class (components/params/by_step.py)
instead of the run schema and its sections (docs/architecture.md, "The train step's backends").
Lower it when a dependency is cut; issue 44 aimed at 30."""


def _project_closure(
    graph: grimp.ImportGraph, roots: tuple[str, ...], excluded: tuple[str, ...]
) -> set[str]:
    """Every project module `roots` import, directly or not, at module or function level,
    not following `excluded`."""
    projects = set(CONFIG["root_packages"])
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        module = todo.pop()
        if module in seen or module in excluded or module.split(".")[0] not in projects:
            continue
        seen.add(module)
        todo.extend(graph.find_modules_directly_imported_by(module))
    return seen


def test_a_gke_launch_of_the_train_step_imports_no_other_backend(graph: grimp.ImportGraph) -> None:
    """The train step dispatches per backend: a GKE launch loads neither the Vertex launcher nor
    the local one (processes, etcd), and nothing but the dispatcher imports the other backends'
    step modules, so leaving them out measures exactly what a GKE launch needs."""
    closure = _project_closure(graph, GKE_TRAIN_STEP, OTHER_BACKENDS)
    assert not closure & {
        "components.launchers.vertex",
        "components.launchers.customjob",
        "components.launchers.local",
        "components.etcd.local",
    }
    for backend in OTHER_BACKENDS:
        importers = graph.find_modules_that_directly_import(backend)
        assert importers & closure <= {"components.steps.train"}, backend
    assert len(closure) <= GKE_TRAIN_CLOSURE_MAX, sorted(closure)


LAZY_IMPORT_PACKAGES = ("components", "trainer", "beam_preprocess", "pipelines")
LAZY_IMPORTS_NOTE = "# lazy imports:"
"""A module-level comment starting with this states the reason for every function-level project
import of its module (one reason for a whole pattern, e.g. each CLI command imports its own)."""


def _unexplained_local_imports(source: str, name: str) -> list[str]:
    """`name:line module` for each function-level project import of `source` with no comment
    within 3 lines above its block of imports (nor on it) and no module-level lazy-imports note."""
    lines = source.splitlines()
    if any(line.startswith(LAZY_IMPORTS_NOTE) for line in lines):
        return []
    found = []
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        imports = [n for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))]
        starts = {n.end_lineno: n.lineno for n in imports}  # line numbers count from 1
        for node in imports:
            module = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
            if (isinstance(node, ast.ImportFrom) and node.level) or not module:
                continue
            if module.split(".")[0] not in LAZY_IMPORT_PACKAGES:
                continue
            first = node.lineno  # the first line of the block of imports this one belongs to
            while True:
                above = first - 1
                while above > 0 and not lines[above - 1].strip():
                    above -= 1  # a blank line between import groups stays inside the block
                if above not in starts:
                    break
                first = starts[above]
            nearby = lines[max(0, first - 4) : node.end_lineno]
            if not any("#" in line for line in nearby):
                found.append(f"{name}:{node.lineno} {module}")
    return found


@pytest.mark.unit
def test_each_function_level_project_import_says_why() -> None:
    """Project imports sit at the module top, so a reader and import-linter follow them; one
    inside a function carries a comment giving its reason (a measured start-up cost, a Beam
    worker's setup, a cycle it breaks), nearby or as a module-level `# lazy imports:` note."""
    found = [
        problem
        for package in LAZY_IMPORT_PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if path.name != "kfp_components.py"
        for problem in _unexplained_local_imports(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert not found, "\n".join(found)


@pytest.mark.unit
def test_a_function_level_import_without_a_reason_is_reported() -> None:
    bare = "def f():\n    x = 1\n\n    import json\n    from trainer import storage\n"
    assert _unexplained_local_imports(bare, "m.py") == ["m.py:5 trainer"]
    why = bare.replace("    x = 1\n", "    # torch: +5 s at import\n")
    assert _unexplained_local_imports(why, "m.py") == []
    assert _unexplained_local_imports(f"{LAZY_IMPORTS_NOTE} each command\n{bare}", "m.py") == []
    far = bare.replace(
        "    x = 1\n", "    # torch: +5 s at import\n    x = 1\n    y = 2\n    z = 3\n"
    )
    assert _unexplained_local_imports(far, "m.py") == ["m.py:8 trainer"]
