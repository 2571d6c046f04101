#!/usr/bin/env bash
# One prepared GPU check for the trainer, under 8 minutes on one NVIDIA H200:
# a ~1.1B Llama (random init), bf16, FSDP2 on 1 GPU, torch.compile on; prints tokens/s and MFU
# (target >= 45%). Usage, from the repository root:
#
#     bash benchmarks/gpu_check.sh [--seq-len 4096] [--micro-batch-size 4] [--steps 40] [--compile false]
#     bash benchmarks/gpu_check.sh --case qlora   # the 1.1B model as QLoRA (NF4 base, LoRA r16), ~2 min
#
# Uses $PYTHON (default: .venv/bin/python if present, else python3), which needs a CUDA build of
# torch plus transformers/peft/pyarrow/fsspec (the project image has them). Nothing is downloaded.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
"$PYTHON" - "$@" <<'PY'
import sys
import torch
if not torch.cuda.is_available():
    sys.exit(f"no CUDA device visible to torch {torch.__version__}: run this on the GPU machine")
print("device:", torch.cuda.get_device_name(0), "| torch", torch.__version__, flush=True)
if "qlora" in sys.argv[1:]:
    try:
        import torchao
    except ImportError:
        sys.exit("--case qlora needs torchao (pip install -c constraints.txt torchao)")
    print("torchao", torchao.__version__, flush=True)
PY
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader || true
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
exec timeout --signal=TERM --kill-after=20 470 "$PYTHON" benchmarks/gpu_check.py "$@"
