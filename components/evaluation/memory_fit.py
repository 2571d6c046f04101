"""Will a model fit the evaluation machine? The rule, and the smallest machine that would fit.

Evaluation holds one model at a time in bf16 on its GPUs, sharded over all of them
(components/evaluation/loading.py), plus activations and the KV cache of generation. The rule:

    required = parameters x 2 bytes x (1 + OVERHEAD)   <=   devices x memory per device x USABLE

`fit_error` applies it and, when the model does not fit, names the smallest accelerator setting
(`eval_accelerator_type` x `eval_accelerator_count`) that would. The parameter count is read from
the safetensors headers (a few kilobytes per file, also on gs://), never from the weights.

Memory per accelerator comes from the platform facts (`components.platform.platform_facts.
accelerator_memory_gib`, issue 21) when that module is present; the callers may also pass it
(`memory_per_device_gib`), e.g. measured from the GPUs the task actually got.
"""

from __future__ import annotations

import json
import logging
import struct
from dataclasses import dataclass

from components.platform.platform_facts import ACCELERATORS, accelerator, machines_for
from trainer import storage

log = logging.getLogger(__name__)

EVAL_BYTES_PER_PARAM = 2
"""Evaluation runs in bf16 on GPUs (loading.pick_device)."""
OVERHEAD = 0.2
"""Activations, the KV cache of batched generation and the CUDA context, as a fraction of the
weights (a 7B model in bf16, 13.0 GiB of weights, needs about 15.6 GiB)."""
USABLE = 0.9
"""Fraction of each accelerator's memory the weights and activations may take (the allocator's
fragmentation and the per-device reserve take the rest)."""
DEVICE_COUNTS = (1, 2, 4, 8)
"""Accelerators per machine that Vertex AI machine types offer (a2/a3/g2 families)."""


def accelerator_memory_gib(name: str) -> float:
    """Memory of one accelerator (Vertex or GKE name), from the platform facts."""
    return float(accelerator(name).memory_gib)


def known_accelerators() -> tuple[str, ...]:
    """The accelerators a machine may be suggested from, smallest memory first (Vertex names)."""
    return tuple(a.vertex_name for a in sorted(ACCELERATORS, key=lambda a: a.memory_gib))


def required_gib(parameters: int) -> float:
    """GPU memory needed to evaluate a model of `parameters` parameters (the rule above)."""
    return parameters * EVAL_BYTES_PER_PARAM * (1 + OVERHEAD) / 2**30


@dataclass(frozen=True)
class Machine:
    """An evaluation machine: `count` accelerators of `memory_gib` each."""

    accelerator: str
    count: int
    memory_gib: float

    @property
    def usable_gib(self) -> float:
        return self.count * self.memory_gib * USABLE

    def describe(self) -> str:
        return f"eval_accelerator_type={self.accelerator}, eval_accelerator_count={self.count}"


def smallest_fitting(need_gib: float) -> Machine | None:
    """The machine with the least total accelerator memory that holds `need_gib` (fewest devices
    on a tie), or None when even the largest cannot. Only combinations some machine type carries
    (platform_facts: e.g. H200s come 8 to an a3-ultragpu-8g)."""
    machines = [
        Machine(name, count, accelerator_memory_gib(name))
        for name in known_accelerators()
        for count in DEVICE_COUNTS
        if machines_for(name, count)
    ]
    fitting = [m for m in machines if m.usable_gib >= need_gib]
    return min(fitting, key=lambda m: (m.count * m.memory_gib, m.count), default=None)


def fit_error(what: str, parameters: int, *, machine: Machine) -> str | None:
    """None when a model of `parameters` fits `machine`, else a sentence naming one that fits."""
    need = required_gib(parameters)
    if need <= machine.usable_gib:
        return None
    have = (
        f"{machine.count} x {machine.accelerator} ({machine.count * machine.memory_gib:.0f} GiB, "
        f"{machine.usable_gib:.0f} GiB usable)"
    )
    better = smallest_fitting(need)
    advice = (
        f"use {better.describe()}"
        if better
        else "no single evaluation machine holds it: evaluate a smaller model"
    )
    return (
        f"{what} has {parameters / 1e9:.2f}B parameters and needs about {need:.0f} GiB of GPU "
        f"memory in bf16 to evaluate, more than {have}: {advice}"
    )


def parameter_count(path: str) -> int | None:
    """Parameters of the model directory at `path` (local or fsspec URI), from the headers of
    its safetensors files; None when it has none (a hub id, .bin weights, a .gguf file)."""
    if not path or not storage.isdir(path):
        return None
    files = [f for f in storage.listdir(path) if f.endswith(".safetensors")]
    if not files:
        return None
    return sum(_safetensors_parameters(f) for f in files)


def _safetensors_parameters(uri: str) -> int:
    """Elements of every tensor in one safetensors file: an 8-byte little-endian header length,
    then a JSON header with each tensor's shape (the format's spec)."""
    with storage.open(uri, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    total = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        count = 1
        for dim in entry["shape"]:
            count *= int(dim)
        total += count
    return total


def eval_machine_error(model: str, accelerator_type: str, count: int) -> str | None:
    """The `fit_error` of the model directory at `model` on `count` x `accelerator_type`; None
    when it fits or its size cannot be read (a hub id, a .gguf file, .bin weights)."""
    if not accelerator_type or count < 1:
        return None
    try:
        memory = accelerator_memory_gib(accelerator_type)
    except ValueError as exc:
        return f"eval_accelerator_type: {exc}"
    parameters = parameter_count(model)
    if parameters is None:
        return None
    machine = Machine(accelerator_type, count, memory)
    return fit_error(f"base model {model!r}", parameters, machine=machine)
