"""CPU and memory of the pipeline's tasks, and whether the GKE GPU node can host the evaluate task.

One table for the pipeline (pipelines/fine_tune.py sets these on each task), the submit paths
(`llmft run` / `llmft schedule` on KFP check the GPU node) and the stack settings (infra/ refuses a
GPU pool whose machine cannot host the evaluate task), so a number is never typed twice.
"""

from __future__ import annotations

from components.platform.platform_facts import gke_fit_error

STEP_RESOURCES: dict[str, tuple[str, str]] = {
    "validate-inputs": ("1", "4G"),
    "preprocess": ("8", "32G"),  # DirectRunner works in the task; Dataflow only launches from it
    "etcd-up": ("1", "2G"),
    "train": ("1", "4G"),  # only follows the training job, which has its own machines
    "evaluate": ("12", "48G"),  # with one L4: a g2-standard-12; fits 7B in bf16
    "register": ("1", "4G"),
    "deploy": ("1", "4G"),  # only waits on Vertex (kfp.local ignores limits)
    "cleanup": ("1", "2G"),
}
"""CPU and memory limits per task (Vertex sizes the machine from limits, not requests)."""

KFP_STEP_REQUESTS: dict[str, tuple[str, str]] = {
    "validate-inputs": ("500m", "2G"),
    "preprocess": ("2", "8G"),  # launching Dataflow; DirectRunner bursts towards the limit
    "etcd-up": ("250m", "1G"),
    "train": ("500m", "2G"),
    "evaluate": ("4", "16G"),  # on a GPU node: fits g2-standard-8 and larger, bursts to the limit
    "register": ("500m", "2G"),
    "deploy": ("500m", "2G"),
    "cleanup": ("250m", "1G"),
}
"""CPU and memory requests of the tasks on KFP. KFP copies only limits into the pod, and
Kubernetes then defaults each request to its limit (kubernetes.io/docs/concepts/configuration/
manage-resources-containers), so without these the preprocess pod asked for 8 CPU / 32G and fit
no node of the stack's e2-standard-8 CPU pool (issue 29 N2), and the evaluate pod 12 CPU / 48G,
which no g2-standard-12 or a2-highgpu-1g node can allocate (review of issue 29, P1).
tests/test_compile.py checks them against `components.platform.platform_facts.gke_allocatable`."""


def kfp_gpu_node_errors(gpu_machine_type: str) -> list[str]:
    """Why the KFP target's evaluate task fits no node of the GKE GPU pool ([] if it fits).

    The scheduler places a pod by its request (`KFP_STEP_REQUESTS["evaluate"]`); a pool machine
    that cannot allocate it leaves the task Pending with no timeout after training was paid for.
    A machine type outside components/platform/platform_facts.py is not judged.
    """
    cpu, memory = KFP_STEP_REQUESTS["evaluate"]
    error = gke_fit_error("the evaluate task", cpu, memory, gpu_machine_type)
    return [f"machine_type={gpu_machine_type!r} (the GPU node pool): {error}"] if error else []
