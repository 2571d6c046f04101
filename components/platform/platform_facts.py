"""Facts of the platforms we launch on, each with its source and the date it was checked.

Everything that decides whether a launch can be scheduled reads these tables, so that a wrong
combination is refused with the fix in the message before any money is spent: which accelerator
attaches to which machine type and how many, what a GKE node can allocate, where GKE mounts the
NVIDIA driver (which KFP backend version honours which compiled feature: kfp_backend.py). The docs' tables are
generated from (or tested against) the same facts.

Units: Compute Engine documents machine memory in "GB" meaning 2**30 bytes (its glossary), so
`memory_gib` below is GiB. Accelerator names: Vertex AI uses enum names (`NVIDIA_L4`), GKE uses
node-label values (`nvidia-l4`); `accelerator()` accepts either.

To update a fact: change its table, its source line and CHECKED, then run the tests.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Literal, get_args

from trainer.gpu_peaks import PEAK_TENSOR_FLOPS

_log = logging.getLogger(__name__)

CHECKED = "2026-12-04"
"""When these tables were last compared with their sources."""

# --- accelerators --------------------------------------------------------------------------------

ACCELERATORS_SOURCE = (
    "cloud.google.com/compute/docs/gpus (GPU models, memory); "
    "cloud.google.com/vertex-ai/docs/reference/rest/v1/MachineSpec#AcceleratorType (Vertex names); "
    "cloud.google.com/kubernetes-engine/docs/how-to/gpus (GKE labels); peak dense bf16/fp16 "
    "FLOP/s from NVIDIA's data sheets, held in trainer/gpu_peaks.py"
)


@dataclass(frozen=True)
class Accelerator:
    """One GPU model as both platforms name it."""

    vertex_name: str
    """Vertex AI `AcceleratorType` enum name."""
    gke_name: str
    """GKE `cloud.google.com/gke-accelerator` node-label value."""
    memory_gib: float
    """Memory per GPU."""
    cuda_name: str
    """Its key in trainer/gpu_peaks.py (part of the CUDA device name): where its peak is held."""
    bf16: bool = True
    """Whether the GPU computes in bf16 (T4 and V100 do not)."""

    @property
    def memory_tbps(self) -> float:
        """Peak memory bandwidth (TB/s): what bounds decoding (GRPO's rollouts, cost.py)."""
        return MEMORY_TBPS[self.cuda_name] if self.vertex_name != "NVIDIA_TESLA_A100" else 1.555

    @property
    def peak_tflops(self) -> float:
        """Peak dense bf16 tensor TFLOPS (fp16 where the GPU has no bf16): the MFU denominator."""
        return PEAK_TENSOR_FLOPS[self.cuda_name] / 1e12


MEMORY_TBPS = {
    "B200": 8.0,
    "H200": 4.8,
    "H100": 3.35,
    "A100": 2.039,
    "L4": 0.3,
    "T4": 0.32,
    "V100": 0.9,
}
"""Peak GPU memory bandwidth in TB/s by `cuda_name`, from NVIDIA's data sheets (B200 HGX, H200
SXM, H100 SXM, A100 80GB SXM (the 40GB: 1.555), L4, T4, V100 SXM2); spec sheet figures, not
measured here."""

ACCELERATORS: tuple[Accelerator, ...] = (
    Accelerator("NVIDIA_B200", "nvidia-b200", 180, "B200"),
    Accelerator("NVIDIA_H200_141GB", "nvidia-h200-141gb", 141, "H200"),
    Accelerator("NVIDIA_H100_MEGA_80GB", "nvidia-h100-mega-80gb", 80, "H100"),
    Accelerator("NVIDIA_H100_80GB", "nvidia-h100-80gb", 80, "H100"),
    Accelerator("NVIDIA_A100_80GB", "nvidia-a100-80gb", 80, "A100"),
    Accelerator("NVIDIA_TESLA_A100", "nvidia-tesla-a100", 40, "A100"),
    Accelerator("NVIDIA_L4", "nvidia-l4", 24, "L4"),
    Accelerator("NVIDIA_TESLA_T4", "nvidia-tesla-t4", 16, "T4", bf16=False),
    Accelerator("NVIDIA_TESLA_V100", "nvidia-tesla-v100", 16, "V100", bf16=False),
)
_BY_NAME = {a.vertex_name: a for a in ACCELERATORS} | {a.gke_name: a for a in ACCELERATORS}


def accelerator(name: str) -> Accelerator:
    """The accelerator for a Vertex (`NVIDIA_L4`) or GKE (`nvidia-l4`) name.

    Raises:
        ValueError: an unknown name, with the known ones.
    """
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(
            f"accelerator {name!r} is unknown: use a Vertex name ("
            f"{', '.join(a.vertex_name for a in ACCELERATORS)}) or its GKE label ("
            f"{', '.join(a.gke_name for a in ACCELERATORS)})"
        ) from None


def unlisted_vertex_accelerator(name: str) -> bool:
    """Whether `name` is a Vertex AI `AcceleratorType` member that ACCELERATORS lacks (e.g.
    NVIDIA_GB200, NVIDIA_RTX_PRO_6000, NVIDIA_TESLA_P100): a real accelerator these tables cannot
    judge, so Vertex checks it at create time instead of being refused here."""
    if name in _BY_NAME or name == "ACCELERATOR_TYPE_UNSPECIFIED":
        return False
    try:
        from google.cloud.aiplatform_v1 import AcceleratorType
    except ImportError:  # without the Vertex SDK nothing can say it exists
        return False
    return name in AcceleratorType.__members__


def gke_accelerator(name: str) -> str | None:
    """GKE accelerator label for a Vertex-style or GKE-style name; None/"" means CPU only."""
    return accelerator(name).gke_name if name else None


# --- machine types -------------------------------------------------------------------------------

MACHINES_SOURCE = (
    "cloud.google.com/compute/docs/accelerator-optimized-machines (A2, A3, A4, G2: vCPUs, "
    "memory and attached GPUs per machine type); cloud.google.com/compute/docs/gpus#n1-gpus "
    "(T4, V100 on N1); cloud.google.com/compute/docs/general-purpose-machines (E2, N2)"
)


@dataclass(frozen=True)
class Machine:
    """A Compute Engine machine type."""

    name: str
    vcpus: int
    memory_gib: float
    accelerator: str = ""
    """Vertex name of the GPUs it carries ("" for none, or any count on N1, see N1_GPUS)."""
    gpus: int = 0


def _family(prefix: str, gpu: str, shapes: dict[str, tuple[int, float, int]]) -> list[Machine]:
    return [Machine(f"{prefix}-{k}", c, m, gpu, n) for k, (c, m, n) in shapes.items()]


GPU_MACHINES: tuple[Machine, ...] = tuple(
    _family(
        "g2-standard",
        "NVIDIA_L4",
        {
            "4": (4, 16, 1),
            "8": (8, 32, 1),
            "12": (12, 48, 1),
            "16": (16, 64, 1),
            "24": (24, 96, 2),
            "32": (32, 128, 1),
            "48": (48, 192, 4),
            "96": (96, 384, 8),
        },
    )
    + _family(
        "a2-highgpu",
        "NVIDIA_TESLA_A100",
        {"1g": (12, 85, 1), "2g": (24, 170, 2), "4g": (48, 340, 4), "8g": (96, 680, 8)},
    )
    + _family("a2-megagpu", "NVIDIA_TESLA_A100", {"16g": (96, 1360, 16)})
    + _family(
        "a2-ultragpu",
        "NVIDIA_A100_80GB",
        {"1g": (12, 170, 1), "2g": (24, 340, 2), "4g": (48, 680, 4), "8g": (96, 1360, 8)},
    )
    + _family(
        "a3-highgpu",
        "NVIDIA_H100_80GB",
        {"1g": (26, 234, 1), "2g": (52, 468, 2), "4g": (104, 936, 4), "8g": (208, 1872, 8)},
    )
    + _family("a3-edgegpu", "NVIDIA_H100_80GB", {"8g": (208, 1872, 8)})
    + _family("a3-megagpu", "NVIDIA_H100_MEGA_80GB", {"8g": (208, 1872, 8)})
    + _family("a3-ultragpu", "NVIDIA_H200_141GB", {"8g": (224, 2952, 8)})
    + _family("a4-highgpu", "NVIDIA_B200", {"8g": (224, 3968, 8)})
)
"""Accelerator-optimized machine types: the GPU model and count are fixed by the machine type."""

N1_GPUS: dict[str, tuple[int, ...]] = {
    "NVIDIA_TESLA_T4": (1, 2, 4),
    "NVIDIA_TESLA_V100": (1, 2, 4, 8),
}
"""GPUs attached to N1 machines (n1-standard/highmem/highcpu): allowed counts per machine."""

_GENERAL_MEMORY_PER_VCPU = {
    "e2-standard": 4,
    "e2-highmem": 8,
    "n2-standard": 4,
    "n2-highmem": 8,
    "n1-standard": 3.75,
    "n1-highmem": 6.5,
    "n1-highcpu": 0.9,
}
_N1_VCPUS = (2, 4, 8, 16, 32, 64, 96)
_GENERAL_VCPUS = {
    "e2-standard": (2, 4, 8, 16, 32),
    "e2-highmem": (2, 4, 8, 16),
    "n2-standard": (2, 4, 8, 16, 32, 48, 64, 80, 96, 128),
    "n2-highmem": (2, 4, 8, 16, 32, 48, 64, 80, 96, 128),
    "n1-standard": (1, *_N1_VCPUS),
    "n1-highmem": _N1_VCPUS,  # there is no n1-highmem-1 nor n1-highcpu-1
    "n1-highcpu": _N1_VCPUS,
}
_GENERAL_MEMORY_EXCEPTIONS = {"n2-highmem-128": 864}
"""Machine types whose memory is not vCPUs x the family's ratio (n2-highmem-128: 864 GB)."""

MACHINES: dict[str, Machine] = {m.name: m for m in GPU_MACHINES} | {
    f"{family}-{n}": Machine(
        f"{family}-{n}", n, _GENERAL_MEMORY_EXCEPTIONS.get(f"{family}-{n}", n * per_vcpu)
    )
    for family, per_vcpu in _GENERAL_MEMORY_PER_VCPU.items()
    for n in _GENERAL_VCPUS[family]
}
"""Every machine type these checks know, by name."""


def machine(name: str) -> Machine | None:
    """The machine type `name`, or None when it is not in these tables (not checked then)."""
    return MACHINES.get(name)


def machines_for(accelerator_name: str, count: int) -> list[str]:
    """Machine types that carry exactly `count` GPUs of `accelerator_name` (either naming)."""
    gpu = accelerator(accelerator_name).vertex_name
    fixed = [m.name for m in GPU_MACHINES if m.accelerator == gpu and m.gpus == count]
    if gpu in N1_GPUS and count in N1_GPUS[gpu]:
        fixed.append("n1-standard-N (N1, any size the GPU count allows)")
    return fixed


def machine_accelerator_errors(machine_type: str, accelerator_name: str, count: int) -> list[str]:
    """Why `count` x `accelerator_name` cannot run on `machine_type`, with the fix ([] if it can).

    A machine type outside these tables is not judged (a new type must not be refused), nor is
    a Vertex accelerator name these tables lack (`unlisted_vertex_accelerator`: a warning is
    logged); any other unknown accelerator is refused, since the launch would fail at the API.
    """
    if not accelerator_name:
        gpu_machine = machine(machine_type)
        if gpu_machine and gpu_machine.gpus:
            return [
                f"{machine_type} carries {gpu_machine.gpus} x {gpu_machine.accelerator}: set "
                f"accelerator_type={gpu_machine.accelerator} and accelerator_count="
                f"{gpu_machine.gpus}, or choose a machine without GPUs"
            ]
        return []
    try:
        gpu = accelerator(accelerator_name)
    except ValueError as exc:
        if unlisted_vertex_accelerator(accelerator_name):
            _log.warning(
                "%s is a Vertex AI accelerator that components/platform/platform_facts.py (checked %s) "
                "does not list: whether %d of them fit %s is left to Vertex AI",
                accelerator_name,
                CHECKED,
                count,
                machine_type,
            )
            return []
        return [str(exc)]
    found = machine(machine_type)
    if machine_type.startswith("n1-"):
        if gpu.vertex_name not in N1_GPUS:
            return [_refit(machine_type, gpu, count, f"N1 machines take only {', '.join(N1_GPUS)}")]
        if count not in N1_GPUS[gpu.vertex_name]:
            allowed = ", ".join(map(str, N1_GPUS[gpu.vertex_name]))
            return [f"{count} x {gpu.vertex_name} on N1: the count must be one of {allowed}"]
        return []
    if found is None:
        return []
    if not found.gpus:
        return [_refit(machine_type, gpu, count, "it carries no GPUs")]
    if found.accelerator != gpu.vertex_name or found.gpus != count:
        carries = f"it carries {found.gpus} x {found.accelerator}"
        return [_refit(machine_type, gpu, count, carries)]
    return []


def node_gpu_errors(machine_type: str, accelerator_name: str, count: int) -> list[str]:
    """Why a GKE pod asking for `count` x `accelerator_name` fits no node of `machine_type`.

    On GKE a pod may take part of a node's GPUs, so the count must be at most what the node
    carries (of the same model); a machine type outside these tables, or an N1 (whose GPU count
    is the pool's choice), is not judged. [] when it fits.
    """
    try:
        gpu = accelerator(accelerator_name)
    except ValueError as exc:
        return [str(exc)]
    most = max([m.gpus for m in GPU_MACHINES if m.accelerator == gpu.vertex_name], default=0)
    most = max(most, *N1_GPUS.get(gpu.vertex_name, (0,)))
    if count > most:
        return [f"{count} x {gpu.gke_name} per pod: no GKE node carries more than {most}"]
    found = machine(machine_type)
    if found is None or not found.gpus:
        return []
    if found.accelerator != gpu.vertex_name or found.gpus < count:
        options = [m.name for m in GPU_MACHINES if m.accelerator == gpu.vertex_name]
        return [
            f"{count} x {gpu.gke_name} per pod cannot land on a {machine_type} node (it carries "
            f"{found.gpus} x {accelerator(found.accelerator).gke_name}): set machine_type to the "
            f"GPU node pool's machine type ({', '.join(options) or 'an N1 machine'}) or the "
            "accelerator to what the pool carries"
        ]
    return []


def _refit(machine_type: str, gpu: Accelerator, count: int, why: str) -> str:
    options = machines_for(gpu.vertex_name, count)
    fix = f"use {' or '.join(options)}" if options else f"no machine type carries {count} of them"
    return (
        f"{count} x {gpu.vertex_name} ({gpu.gke_name}) cannot run on {machine_type}: {why}; {fix}"
    )


# --- GKE node allocatable ------------------------------------------------------------------------

GKE_ALLOCATABLE_SOURCE = (
    "cloud.google.com/kubernetes-engine/docs/concepts/plan-node-sizes (CPU reservations: 6% of "
    "the first core, 1% of the next, 0.5% of the next 2, 0.25% above 4; memory: 25% of the first "
    "4 GiB, 20% of the next 4, 10% of the next 8, 6% of the next 112, 2% above 128; 100 MiB "
    "eviction threshold; 255 MiB on machines under 1 GiB)"
)
GKE_SYSTEM_PODS_RESERVE = (0.5, 1.0)
"""(vCPU, GiB) kept free for GKE's own DaemonSets (logging, metrics, kube-proxy, the GPU device
plugin). Not a published figure: our margin, so that a pod sized to the formula still lands."""

_CPU_STEPS = ((1, 0.06), (1, 0.01), (2, 0.005), (float("inf"), 0.0025))
_MEMORY_STEPS = ((4, 0.25), (4, 0.20), (8, 0.10), (112, 0.06), (float("inf"), 0.02))


def _reserved(total: float, steps: tuple[tuple[float, float], ...]) -> float:
    reserved, left = 0.0, total
    for size, share in steps:
        part = min(left, size)
        reserved += part * share
        left -= part
        if left <= 0:
            break
    return reserved


@dataclass(frozen=True)
class Allocatable:
    """What pods can request on one node (after GKE's reservations and our system-pod margin)."""

    cpu: float
    memory_gib: float


def gke_allocatable(machine_type: str) -> Allocatable | None:
    """Allocatable CPU and memory of a GKE node of `machine_type` (None: unknown type)."""
    found = machine(machine_type)
    if found is None:
        return None
    cpu = found.vcpus - _reserved(found.vcpus, _CPU_STEPS) - GKE_SYSTEM_PODS_RESERVE[0]
    if found.memory_gib < 1:
        memory = found.memory_gib - 255 / 1024
    else:
        memory = found.memory_gib - _reserved(found.memory_gib, _MEMORY_STEPS) - 100 / 1024
    return Allocatable(cpu=round(cpu, 3), memory_gib=round(memory - GKE_SYSTEM_PODS_RESERVE[1], 3))


_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(m|k|M|G|T|Ki|Mi|Gi|Ti)?$")
_SCALE = {
    None: 1,
    "m": 0.001,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}


def quantity(text: str) -> float:
    """A Kubernetes/KFP resource quantity as a number ("500m" -> 0.5, "32G" -> 32e9)."""
    match = _QUANTITY.match(str(text).strip())
    if not match:
        raise ValueError(f"{text!r} is not a resource quantity such as 8, 500m, 32G or 28Gi")
    return float(match.group(1)) * _SCALE[match.group(2)]


def gke_fit_error(what: str, cpu: str, memory: str, machine_type: str) -> str | None:
    """Why a pod requesting `cpu` and `memory` fits no node of `machine_type` (None if it fits)."""
    room = gke_allocatable(machine_type)
    if room is None:
        return None
    need_cpu, need_gib = quantity(cpu), quantity(memory) / 2**30
    if need_cpu <= room.cpu and need_gib <= room.memory_gib:
        return None
    return (
        f"{what} requests {cpu} CPU / {memory} memory, but a {machine_type} node can allocate "
        f"only {room.cpu:g} CPU / {room.memory_gib:.1f} GiB: lower the request or use a larger "
        "machine type"
    )


# --- GKE GPU nodes -------------------------------------------------------------------------------

GKE_NVIDIA_DIR = "/usr/local/nvidia"
"""Where GKE's device plugin mounts the NVIDIA driver into GPU containers; its lib64 must be on
the loader path or pip-installed torch finds no CUDA (GoogleCloudPlatform/container-engine-
accelerators cmd/nvidia_gpu/device-plugin.yaml; cloud.google.com/kubernetes-engine/docs/how-to/
gpus "CUDA libraries"). Vertex injects the driver itself."""
GKE_NVIDIA_LIBRARY_PATH = f"{GKE_NVIDIA_DIR}/lib64:{GKE_NVIDIA_DIR}/lib"

GKE_SPOT_POD_GRACE_S = 15
"""Seconds a non-system pod gets between SIGTERM and SIGKILL when a GKE Spot node is preempted
(30 s notice, half for user pods: cloud.google.com/kubernetes-engine/docs/concepts/spot-vms)."""

# --- flex-start (Dynamic Workload Scheduler) on Vertex AI (issue 32 review, P6) ------------------

VERTEX_FLEX_START_SOURCE = (
    "cloud.google.com/vertex-ai/docs/training/schedule-jobs-dws: flex-start (DWS) training jobs "
    "need L4, A100, H100, H200 or B200 GPUs and a timeout of 7 days or less"
)
VERTEX_FLEX_START_GPUS = frozenset(
    {
        "NVIDIA_L4",
        "NVIDIA_TESLA_A100",
        "NVIDIA_A100_80GB",
        "NVIDIA_H100_80GB",
        "NVIDIA_H100_MEGA_80GB",
        "NVIDIA_H200_141GB",
        "NVIDIA_B200",
    }
)
"""Vertex accelerator names a flex-start CustomJob may use (VERTEX_FLEX_START_SOURCE)."""


def vertex_flex_start(accelerator_name: str) -> bool:
    """Whether Vertex AI offers flex-start capacity for this GPU (no GPU: it does not)."""
    if not accelerator_name:
        return False
    return accelerator(accelerator_name).vertex_name in VERTEX_FLEX_START_GPUS


# --- Vertex AI Gen AI evaluation service ---------------------------------------------------------

JudgeMetric = Literal[
    "", "text_quality", "instruction_following", "fluency", "coherence", "safety", "verbosity",
    "groundedness",
]  # fmt: skip
"""The `judge_metric` run parameter: "" (no judge) or one of the service's pairwise metrics
(components/evaluation/judge.py)."""
PAIRWISE_METRICS: tuple[str, ...] = tuple(m for m in get_args(JudgeMetric) if m)
"""The service's pairwise metrics by their short names (vertexai's MetricPromptTemplateExamples
.Pairwise, upper-cased)."""
