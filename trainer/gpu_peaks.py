"""MFU's two halves, held once: peak dense tensor FLOP/s of each GPU model (the denominator) and
training FLOPs per token (the numerator, `flops_per_token`).

The trainer looks a GPU up by its CUDA device name (`trainer.metrics.peak_flops`); the platform
table looks each Vertex/GKE accelerator up by the key it names (components/platform/platform_facts.py,
`Accelerator.cuda_name`), which is what the cost estimate uses, with the trainer's FLOPs per token
(components/preflight/model_size.py). No torch here, so the launch checks can import it.

Sources: NVIDIA data sheets, dense (without 2:4 sparsity), bf16, or fp16 where the GPU has no
bf16 -- H200 SXM and H100 SXM: 989.5 TFLOPS ("1,979 with sparsity"); H200 NVL and H100 NVL:
835.5 ("1,671 with sparsity"); H100 PCIe: 756; A100: 312; L40S: 362 ("733 with sparsity"); L40:
181 ("362 with sparsity"); L4: 121 ("242 with sparsity"); A10/A10G: 125; B200: 2,250 (4.5
PFLOPS FP8 dense per GPU, bf16 half of it); T4: 65 fp16; V100 SXM2: 125 fp16, V100 PCIe: 112,
V100S: 130. Checked 2026-12-05. A MIG slice reports its whole GPU's name: set `peak_flops`."""

from __future__ import annotations

PEAK_TENSOR_FLOPS = {
    "H200 NVL": 835.5e12,
    "H200": 989.5e12,
    "H100 NVL": 835.5e12,
    "H100 PCIe": 756e12,
    "H100": 989.5e12,
    "A100": 312e12,
    "A10": 125e12,
    "L40S": 362e12,
    "L40": 181e12,
    "L4": 121e12,
    "B200": 2250e12,
    "T4": 65e12,
    "V100S": 130e12,
    "V100-PCIE": 112e12,
    "V100": 125e12,
}
"""Keys are parts of CUDA device names ("NVIDIA H100 80GB HBM3"); a variant comes before the
name it contains ("H100 NVL" before "H100", "A100" before "A10", "L40S" before "L40" before
"L4"): the first key found in a name wins."""


def peak_of(device_name: str) -> float | None:
    """Peak FLOP/s of the GPU called `device_name`, or None when the model is not listed."""
    return next((v for key, v in PEAK_TENSOR_FLOPS.items() if key in device_name), None)


def flops_per_token(
    matmul_params: int, num_layers: int, hidden: int, seq_len: int, lora: bool = False
) -> float:
    """Training FLOPs per token: 6 per matmul parameter (4 with LoRA: no weight gradients of the
    frozen base) plus the attention scores' 12 x layers x hidden x seq_len."""
    return (4 if lora else 6) * matmul_params + 12 * num_layers * hidden * seq_len
