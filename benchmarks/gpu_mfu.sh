#!/usr/bin/env bash
# GPU benchmark in one call (a few minutes on one H200): training-step MFU of a ~350M model, then
# the time split of a short RL run (random 100m Qwen2, vLLM engine) on the same GPU.
# Writes benchmarks/out/gpu_mfu.json and benchmarks/out/gpu_time_split.json (or $OUT/...).
#
#   bash benchmarks/gpu_mfu.sh
#
# Python: $PYTHON, else .venv/bin/python when it sees CUDA, else python3. The GPU machine needs
# torch (CUDA), megatron-core, transformers and vllm installed (launch/setup_env.sh does it on a
# CUDA machine with network). Not yet run: no GPU was lent to the session that wrote it.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]] && .venv/bin/python -c "import torch,sys; sys.exit(not torch.cuda.is_available())"; then
    PYTHON=.venv/bin/python
  else
    PYTHON=python3
  fi
fi
DEST=${OUT:-benchmarks/out}
mkdir -p "$DEST"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
timeout 300 "$PYTHON" -m benchmarks.gpu_mfu --json "$DEST/gpu_mfu.json"
timeout 300 "$PYTHON" -m benchmarks.time_split --steps 4 --size 100m --threads 8 \
  --out "$DEST" --json "$DEST/gpu_time_split.json" \
  --override rollout.engine=vllm model.dtype=bfloat16 rollout.dtype=bfloat16
