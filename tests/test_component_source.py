"""The spine: each step's request is its one specification (docs/architecture.md, "Adding a run
parameter").

- components/kfp_components.py is what pipelines/component_source.py generates from the steps;
- a step's view of the run parameters holds exactly those it takes;
- the compiled pipelines keep the interface users have saved (tests/golden/pipeline_interface.json,
  taken from the compiled YAML before the redesign: names, types, defaults);
- the recipe holds: a throwaway run parameter and a throwaway data setting, each added as the
  recipe says (one field, one use), reach the pipeline, the component and the tool
  (integration: it regenerates and compiles a copy of the project in a child process).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from components.params.step_params import STEPS, for_step, inputs_of, taken_by
from components.steps.component_spec import own_inputs
from pipelines import component_source, step_params_source

ROOT = Path(__file__).resolve().parent.parent


def test_the_generated_components_are_current() -> None:
    for generator in (step_params_source, component_source):
        assert generator.SOURCE.read_text() == generator.source(), (
            f"{generator.SOURCE.name} is stale: run `make compile` (python -m "
            "pipelines.component_source) and commit it"
        )


def test_each_component_takes_its_steps_parameters_and_its_own_inputs() -> None:
    from components import kfp_components

    for module in component_source.STEP_MODULES:
        spec = module.COMPONENT
        inputs = kfp_components.ALL_COMPONENTS[spec.name].component_spec.inputs or {}
        outputs = kfp_components.ALL_COMPONENTS[spec.name].component_spec.outputs or {}
        own = {f.name for f in own_inputs(spec.request)}
        assert set(inputs) | set(outputs) >= set(taken_by(spec.name)) | own - {"status"}, spec.name
        assert set(inputs) - own == set(taken_by(spec.name)), spec.name


def test_a_step_reads_only_the_parameters_it_takes() -> None:
    view = for_step("etcd_up", backend="gke", namespace="team-a")
    assert (view.backend, view.namespace, view.rdzv_backend) == ("gke", "team-a", "etcd-v3")
    with pytest.raises(
        AttributeError, match=r"etcd_up step does not take run parameter 'max_steps'"
    ):
        _ = view.max_steps
    with pytest.raises(TypeError, match="does not take run parameter"):
        for_step("etcd_up", max_steps=3)
    assert [f.name for f in dataclasses.fields(view)] == list(taken_by("etcd_up"))
    assert type(view).__module__ == "components.params.by_step"  # no run schema in a step
    assert set(taken_by("validate_inputs")) >= {name for step in STEPS for name in taken_by(step)}


def test_the_wiring_replaces_only_what_an_earlier_step_resolves() -> None:
    from components.params.run_params import RunParams

    wired = inputs_of(RunParams(), "train", base_model="<validated>")
    assert wired["base_model"] == "<validated>" and wired["max_steps"] == RunParams.max_steps
    with pytest.raises(TypeError):
        inputs_of(RunParams(), "train", eval_tasks="mmlu")


@pytest.mark.parametrize("target", ["vertex", "kfp"])
def test_the_compiled_interface_is_the_one_users_saved(target: str) -> None:
    """A saved Vertex schedule or console form keeps working: every parameter it saved keeps its
    name and type, and its default except where an issue changed it on purpose; parameters added
    since are optional.

    Issue 46 changed exactly six defaults of both targets, to the first-run shape a new project's
    quota can usually start (components/params/target_defaults.py FIRST_RUN_SHAPE, docs/deploy/
    README.md "The run's shape"): nodes 2 -> 1, machine_type a3-highgpu-8g -> g2-standard-24,
    accelerator_type NVIDIA_H100_80GB -> NVIDIA_L4, accelerator_count 8 -> 2, quantize_base none
    -> nf4, trainer_overrides {} -> {"lora_rank": 16}. A saved schedule keeps working: it holds its
    own template and values (a Vertex schedule its copy of the template, a KFP recurring run its
    pipeline version and parameters), so it runs the shape it was saved with."""
    golden = json.loads((ROOT / "tests/golden/pipeline_interface.json").read_text())[target]
    document = next(yaml.safe_load_all((ROOT / f"compiled/fine_tune.{target}.yaml").read_text()))
    compiled = {
        name: {
            "type": value["parameterType"],
            "default": value.get("defaultValue"),
            "optional": value.get("isOptional", False),
        }
        for name, value in document["root"]["inputDefinitions"]["parameters"].items()
    }
    for name, saved in golden.items():
        assert compiled.get(name) == saved, name
    added = {name: value for name, value in compiled.items() if name not in golden}
    assert all(value["optional"] for value in added.values()), added  # new ones have defaults


RECIPE = """
import re, sys
from pathlib import Path

def edit(path, old, new):
    text = Path(path).read_text()
    assert old in text, (path, old)
    Path(path).write_text(text.replace(old, new, 1))

# A run parameter the evaluate step uses: (1) the schema field, (2) its use.
edit("components/params/run_params.py", "    max_cost_usd: float = param(",
     "    throwaway_knob: int = param(7, 'A throwaway knob.', ge=0, steps=('evaluate',))\\n"
     "    max_cost_usd: float = param(")
edit("components/steps/evaluate.py", "def run(request: EvaluateRequest)",
     "def throwaway_use(request: EvaluateRequest) -> int:\\n"
     "    return request.params.throwaway_knob\\n\\n\\ndef run(request: EvaluateRequest)")
# A data setting preprocessing uses: (1) the field, (2) its use.
edit("beam_preprocess/data_shape.py", "    bigquery_query: str = setting(",
     "    throwaway_setting: str = setting('x', 'A throwaway setting.')\\n"
     "    bigquery_query: str = setting(")
edit("beam_preprocess/options.py", "    def as_dict(self)",
     "    def throwaway_use(self) -> str:\\n        return self.throwaway_setting\\n\\n"
     "    def as_dict(self)")

import subprocess
subprocess.run([sys.executable, "-m", "pipelines.component_source"], check=True)
from kfp import compiler
from pipelines.fine_tune import build_fine_tune
compiler.Compiler().compile(build_fine_tune("vertex"), package_path="out.yaml")

from components.params.step_params import for_step
from components.steps.evaluate import throwaway_use
from components.params.step_params import request_of
from components.steps.evaluate import COMPONENT
assert throwaway_use(request_of(COMPONENT, throwaway_knob=3, tuned_model=None, dataset=None, metrics=None, report=None)) == 3
from beam_preprocess.options import PreprocessConfig
from apache_beam.options.pipeline_options import PipelineOptions
config = PreprocessConfig.from_options(PipelineOptions(
    ["--input=a.jsonl", "--output=o", "--tokenizer=t", "--seq-len=64", "--throwaway-setting=y"]))
assert config.throwaway_use() == "y"
from components.steps.preprocess import beam_argv, COMPONENT as PREPROCESS
from components.params.step_params import request_of as of
argv = beam_argv(of(PREPROCESS, train_data_uri="a", base_model="t", throwaway_setting="z", run_id="r", dataset=None, summary=None, gcp_resources=""), "o")
assert "--throwaway-setting=z" in argv, argv
print("recipe ok")
"""


def _wired(document: dict, component: str) -> dict[str, set[str]]:
    """Each task's parameter inputs, through the nested DAGs (conditions) of `component`."""
    wired: dict[str, set[str]] = {}
    for task, spec in document["components"][component]["dag"]["tasks"].items():
        name = spec["componentRef"]["name"]
        if "dag" in document["components"].get(name, {}):
            wired.update(_wired(document, name))
        else:
            wired[task] = set(spec["inputs"].get("parameters", {}))
    return wired


@pytest.mark.integration
def test_a_new_parameter_takes_one_field_and_its_use(tmp_path: Path) -> None:
    """The recipe of docs/architecture.md, applied to a copy of the project: the field and its
    use are the only edits; the component, the wiring, the console description, the Beam flag
    and the preprocess step's argv follow."""
    for package in ("components", "pipelines", "beam_preprocess", "trainer"):
        shutil.copytree(
            ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(RECIPE)],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "recipe ok" in done.stdout
    document = yaml.safe_load((tmp_path / "out.yaml").read_text())
    root = document["root"]
    assert (
        root["inputDefinitions"]["parameters"]["throwaway_knob"]["description"]
        == "A throwaway knob."
    )
    assert root["inputDefinitions"]["parameters"]["throwaway_setting"]["defaultValue"] == "x"
    wired = _wired(document, root["dag"]["tasks"]["exit-handler-1"]["componentRef"]["name"])
    assert "throwaway_knob" in wired["evaluate"]
    assert "throwaway_setting" in wired["preprocess"]
    assert (
        "throwaway_knob" in wired["validate-inputs"]
        and "throwaway_setting" in wired["validate-inputs"]
    )
    assert "throwaway_knob" not in wired["train"]
