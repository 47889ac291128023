# The two commands of the README: `make demo` and `make test`. Both set up first (idempotent).
VENV ?= .venv
BIN := $(VENV)/bin
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: setup demo test lint typecheck unit bench bench-scheduler bench-long-context long-context base-model clean gpu-check gpu-wheels

setup:
	bash launch/setup_env.sh

demo: setup
	$(BIN)/megatron-rl train configs/demo_cpu.yaml

lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck:
	$(BIN)/mypy

unit:
	$(BIN)/python -m pytest -q -ra

test: setup lint typecheck unit

bench: setup
	$(BIN)/python benchmarks/run_all.py

# The domain scheduler in real training (not part of `make bench`), ~45 min on 2 cores: 4 arms x
# 3 report seeds on 12 tiny domains, the per-domain temperature A/B, the constructed pair alone; writes
# benchmarks/scheduler_real.json, scheduler_pair.json, their PNGs and docs/scheduler_seesaw.png.
bench-scheduler: setup
	$(BIN)/python benchmarks/scheduler_real.py
	$(BIN)/python benchmarks/scheduler_pair.py

# Long-context RL steps at CP=2 vs CP=1 on CPU (memory per rank, step time), merged into
# benchmarks/results.json as long_context.cp2_vs_cp1.
bench-long-context: setup
	$(BIN)/python benchmarks/run_all.py --only long_context

# Long-context RL with context parallelism 2: two CPU processes under torchrun.
long-context: setup
	OMP_NUM_THREADS=1 $(BIN)/python -m torch.distributed.run --standalone --nproc-per-node 2 \
		-m launch.cli train configs/long_context_cpu.yaml

# The GPU paths one GPU can check, in <= 5 min, with no set-up step (benchmarks/gpu_check.py):
# runs from the machine's own python (torch + transformers) plus the wheels `make gpu-wheels`
# put in gpu_wheels/ (carry that folder along); checks it cannot run are listed as unrun.
GPU_PY ?= $(shell test -x $(BIN)/python && echo $(BIN)/python || echo python3)
gpu-check:
	mkdir -p benchmarks/out
	timeout 300 $(GPU_PY) benchmarks/gpu_check.py --json benchmarks/out/gpu_check.json

# Wheels for a GPU machine without network (Python $(GPU_PYVER), x86_64 and aarch64; ~12 MiB):
# megatron-core and the pure-Python/abi3 packages the checks need beside torch + transformers.
GPU_PYVER ?= 3.12
GPU_WHEELS := megatron-core==0.16.1 psutil aiohttp aiohappyeyeballs aiosignal attrs frozenlist \
	multidict propcache yarl idna jsonschema jsonschema-specifications referencing rpds-py
gpu-wheels:
	mkdir -p gpu_wheels
	for plat in x86_64 aarch64; do \
	  $(BIN)/pip download -q --disable-pip-version-check --python-version $(GPU_PYVER) \
	    --only-binary=:all: --no-deps -d gpu_wheels --platform manylinux2014_$$plat \
	    --platform manylinux_2_17_$$plat --platform manylinux_2_24_$$plat \
	    --platform manylinux_2_28_$$plat --platform manylinux_2_34_$$plat $(GPU_WHEELS) || exit 1; \
	done
	du -sh gpu_wheels

# Reproduce the shipped tiny base model (SFT from scratch on reasoning-gym tasks).
base-model: setup
	$(BIN)/megatron-rl sft configs/base_sft.yaml
	rm -rf models/tiny-base && cp -r runs/base_sft/hf models/tiny-base

clean:
	rm -rf runs .pytest_cache .mypy_cache .ruff_cache
