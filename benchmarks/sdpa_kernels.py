"""Which SDPA kernel is fastest for the GPU check's attention: causal, bf16, GQA 32/4, head dim 64.

    python benchmarks/sdpa_kernels.py [--batch 4] [--seq-len 4096]

Times forward + backward of `F.scaled_dot_product_attention(is_causal=True, enable_gqa=True)` with
each kernel alone, for contiguous [B, H, L, D] inputs ("bhld") and for the transposed views of
[B, L, H, D] projections that transformers' attention layers pass ("blhd") (torch.nn.attention.sdpa_kernel), median of 20 calls after 5 warm-up calls, and
prints achieved TFLOP/s counting the causal half of the scores (forward 2 x 2 x B x H x L^2 x D / 2,
backward 2.5 x forward, FlashAttention-2's convention). A kernel that refuses the inputs prints
its error. The trainer's `sdpa_kernels` setting picks the order (trainer/attention.py).
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

KERNELS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
}


def time_kernel(backend: SDPBackend, q, k, v, calls: int = 20) -> float:
    """Median seconds of one forward + backward."""
    times = []
    for i in range(calls + 5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        out.backward(torch.ones_like(out))
        end.record()
        torch.cuda.synchronize()
        if i >= 5:
            times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def _inputs(layout: str, b: int, heads: int, length: int, d: int) -> torch.Tensor:
    shape = (b, heads, length, d) if layout == "bhld" else (b, length, heads, d)
    x = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
    x = x if layout == "bhld" else x.transpose(1, 2)
    return x.requires_grad_(True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=4096)
    args = parser.parse_args()
    b, hq, hkv, length, d = args.batch, 32, 4, args.seq_len, 64
    flops = 3.5 * 2 * 2 * b * hq * length * length * d / 2
    results = {}
    for layout in ("bhld", "blhd"):
        q, k, v = (_inputs(layout, b, heads, length, d) for heads in (hq, hkv, hkv))
        for name, backend in KERNELS.items():
            key = f"{name}-{layout}"
            try:
                seconds = time_kernel(backend, q, k, v)
                results[key] = {"ms": seconds * 1e3, "tflops": flops / seconds / 1e12}
            except RuntimeError as exc:
                results[key] = {"error": str(exc).splitlines()[0][:200]}
            print(key, results[key], flush=True)
    print("RESULT " + json.dumps({"sdpa": results, "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()
