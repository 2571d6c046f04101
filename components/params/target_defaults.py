"""The run parameters' defaults that depend on where the pipeline runs: one dict per compile target
(`RunParams.for_target`), over the fields' own defaults, which are the local runner's (and
`make demo`'s). Kept apart from the schema (components/params/run_params.py) so that a change of
shape is one reviewed place: tests/golden/pipeline_interface.json records the compiled defaults.
"""

from __future__ import annotations

from typing import Any

FIRST_RUN_SHAPE: dict[str, Any] = {
    "nodes": 1,
    "machine_type": "g2-standard-24",
    "accelerator_type": "NVIDIA_L4",
    "accelerator_count": 2,
    "quantize_base": "nf4",
    "trainer_overrides": {"lora_rank": 16},
}
"""A cloud run's shape unless set (issue 46): QLoRA (nf4 base weights, rank-16 adapters) on one
g2-standard-24 with 2 L4. It asks for 2 GPUs of the quota (the evaluate step's default GPU is an
L4 too), is the GPU pool the deploy guide's stack creates (a GKE console run finds its nodes), and
fits a 7B base model (the guide's Qwen/Qwen2.5-7B-Instruct: ~21 GiB of an L4's 24 by
trainer/memory_model.py at the default seq_len and micro_batch_size; tests/test_quota.py). Google documents no fixed GPU quota for a new project
(cloud.google.com/compute/resource-usage: "Not all projects have the same quotas";
cloud.google.com/vertex-ai/docs/quotas: custom-training GPU quota is per region and requested), so
this is a small shape, not a promise: the quota check still refuses a run the project cannot
start. The big shapes are the same six parameters set otherwise (docs/deploy/README.md, "The
run's shape"): full fine-tuning on 2 x 8 H100 is nodes=2, machine_type=a3-highgpu-8g,
accelerator_type=NVIDIA_H100_80GB, accelerator_count=8, quantize_base=none, trainer_overrides={}."""

TARGET_DEFAULTS: dict[str, dict[str, Any]] = {
    "local": {},
    "vertex": {"backend": "vertex", "preprocess_runner": "DataflowRunner", **FIRST_RUN_SHAPE},
    "kfp": {
        "backend": "gke",
        "preprocess_runner": "DataflowRunner",
        "service_account": "llmft-trainer",  # training pods' KSA (docs/deploy/rbac.yaml)
        **FIRST_RUN_SHAPE,
    },
}
"""Per-target defaults of the parameters whose right value depends on where the pipeline runs
(the fields' own defaults are the local runner's, `make demo`'s): a run launched from the console
with only data, base model, project, bucket and Dataflow account filled in must pass
(tests/test_compile.py)."""
