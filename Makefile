# The two commands of the README: `make demo` and `make test`. Both set up first (idempotent).
VENV ?= .venv
BIN := $(VENV)/bin
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: setup demo test lint typecheck unit bench bench-scheduler base-model clean gpu-check

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

# The domain scheduler in real training: 4 arms x 3 report seeds on 12 tiny domains, ~90 min
# on 2 cores (not part of `make bench`); writes benchmarks/scheduler_real.json and PNGs.
bench-scheduler: setup
	$(BIN)/python benchmarks/scheduler_real.py

# The GPU paths in <= 5 min on one GPU: TE vs local spec, MFU at ~350M, SGLang distributed update.
gpu-check: setup
	mkdir -p benchmarks/out
	timeout 300 $(BIN)/python benchmarks/gpu_check.py --json benchmarks/out/gpu_check.json

# Reproduce the shipped tiny base model (SFT from scratch on reasoning-gym tasks).
base-model: setup
	$(BIN)/megatron-rl sft configs/base_sft.yaml
	rm -rf models/tiny-base && cp -r runs/base_sft/hf models/tiny-base

clean:
	rm -rf runs .pytest_cache .mypy_cache .ruff_cache
