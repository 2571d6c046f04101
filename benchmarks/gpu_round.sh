#!/usr/bin/env bash
# The prepared GPU round, one call on a lent GPU machine (about 6 minutes on one H200): SDPA
# kernels alone, then the 1B MFU check (benchmarks/gpu_check.py) with PyTorch's kernel order at
# micro-batch 4 and 8 and with cuDNN's kernel at micro-batch 8, then the demo-real step
# (SmolLM2-135M LoRA). Logs go to $OUT (default /tmp/llmft-gpu-round); one line per case here.
#
#     bash benchmarks/gpu_round.sh
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/llmft-gpu-round}
mkdir -p "$OUT"
PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
"$PYTHON" benchmarks/sdpa_kernels.py 2>&1 | tee "$OUT/sdpa.log" | grep -E "^(flash|cudnn|efficient)"
run() {  # name, gpu_check args...
  local name=$1; shift
  bash benchmarks/gpu_check.sh "$@" >"$OUT/$name.log" 2>&1
  echo "$name rc=$? $(grep '^RESULT' "$OUT/$name.log" || tail -3 "$OUT/$name.log")"
}
run mb4-auto
run mb8-auto --micro-batch-size 8
run mb8-cudnn --micro-batch-size 8 --sdpa-kernels cudnn,flash,math
run demo-lora --case smollm2-lora
