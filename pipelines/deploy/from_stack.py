"""`llmft config from-stack`: the deploy config from the infra stack's outputs.

    pulumi -C infra stack output --json | llmft config from-stack --stack-output - --output deploy.yaml

The Pulumi program in infra/ creates the bucket, registries and service accounts and exports
their names; this writes them into the keys of the deploy config (pipelines/deploy/config.py) that
name them, so no name is typed twice. An existing output file is updated in place: keys the stack
does not own (schedule, other parameters, labels) are kept.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from components.platform.platform_facts import accelerator
from pipelines.deploy.config import load_config
from trainer.config_file import read_yaml_mapping

REQUIRED = (
    "project",
    "region",
    "pipeline_root",
    "kfp_pipeline_root",
    "work_uri",
    "kfp_registry",
    "pipeline_service_account",
    "trainer_service_account",
    "dataflow_service_account",
)
"""Outputs every stack has (infra/llmft_infra/program.py); GKE stacks add gke_cluster etc."""


def parse_stack_output(text: str, source: str = "stack output") -> dict[str, Any]:
    """Parse `pulumi stack output --json`; ValueError naming what is missing or malformed."""
    try:
        outputs = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{source} is not JSON ({exc.msg}): pass `pulumi stack output --json`"
        ) from None
    if not isinstance(outputs, dict):
        raise ValueError(f"{source}: expected a JSON object of stack outputs")
    missing = [key for key in REQUIRED if not outputs.get(key)]
    if missing:
        raise ValueError(
            f"{source} lacks {', '.join(missing)}: is it the llmft infra stack, after `pulumi up`?"
        )
    return outputs


def config_from_stack(outputs: dict[str, Any]) -> dict[str, Any]:
    """The deploy-config keys the stack determines, as a nested mapping.

    The trainer's identity depends on where it runs: a Vertex CustomJob runs as the trainer's
    Google service account (an email, under `vertex.parameters`), PyTorchJob pods on GKE as the
    Kubernetes service account that Workload Identity maps to it (`trainer_ksa`, under
    `kfp.parameters`). A GKE stack's GPU pool also fixes the training machines: its machine type,
    accelerator (in the Vertex naming the pipeline takes) and count go to the shared parameters,
    a combination that Vertex AI offers too.
    """
    parameters: dict[str, Any] = {
        "project": outputs["project"],
        "region": outputs["region"],
        "work_uri": outputs["work_uri"],
        "dataflow_service_account": outputs["dataflow_service_account"],
    }
    vertex_parameters = {"service_account": outputs["trainer_service_account"]}
    kfp: dict[str, Any] = {"pipeline_root": outputs["kfp_pipeline_root"]}
    if outputs.get("gpudirect"):
        # The GPU pool has the GPUDirect NIC networks (infra/llmft_infra/gpudirect.py).
        parameters["gpudirect"] = True
    if outputs.get("gke_cluster"):
        parameters["gke_cluster"] = outputs["gke_cluster"]
        parameters["namespace"] = outputs["namespace"]
        parameters["machine_type"] = outputs["gpu_machine_type"]
        parameters["accelerator_type"] = accelerator(outputs["accelerator_type"]).vertex_name
        parameters["accelerator_count"] = int(outputs["accelerator_count"])
        kfp["service_account"] = outputs["pipeline_ksa"]
        kfp["parameters"] = {"service_account": outputs["trainer_ksa"]}
    return {
        "parameters": parameters,
        "vertex": {
            "project": outputs["project"],
            "region": outputs["region"],
            "pipeline_root": outputs["pipeline_root"],
            "service_account": outputs["pipeline_service_account"],
            "registry": outputs["kfp_registry"],
            "parameters": vertex_parameters,
        },
        "kfp": kfp,
    }


def _drop_moved(base: dict[str, Any], outputs: dict[str, Any]) -> dict[str, Any]:
    """Forget a shared `service_account` that an earlier from-stack wrote (the trainer's email):
    it now lives under `vertex.parameters`, and left shared it would reach KFP runs too."""
    shared = base.get("parameters")
    if isinstance(shared, dict) and shared.get("service_account") == outputs.get(
        "trainer_service_account"
    ):
        base = {**base, "parameters": {k: v for k, v in shared.items() if k != "service_account"}}
    return base


def _merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def write_config(outputs: dict[str, Any], path: Path) -> dict[str, Any]:
    """Write (or update) the deploy config at `path`; returns what was written.

    The result is loaded back with `load_config`, so a written file is always one that
    `llmft run|schedule|upload --config` accepts.
    """
    import yaml

    base = read_yaml_mapping(path) if path.exists() else {}
    config = _merge(_drop_moved(base, outputs), config_from_stack(outputs))
    text = yaml.safe_dump(config, sort_keys=False)
    header = "# Written by `llmft config from-stack` from the infra stack's outputs; edit freely.\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(path.name + ".tmp")
    staged.write_text(header + text)
    try:
        load_config(staged)  # the user's file is replaced only by a config llmft accepts
    except ValueError as exc:
        staged.unlink()
        raise ValueError(str(exc).replace(str(staged), str(path))) from None
    staged.replace(path)
    return config
