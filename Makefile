# The two commands of the README: `make demo` and `make test`. Both set up first (idempotent).
# `make test-fast` is the quick loop while editing: lint and tests/unit only (no type check, no
# tests/integration).
VENV ?= .venv
BIN := $(VENV)/bin
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: setup demo test test-fast lint typecheck unit unit-fast integration bench bench-scheduler bench-long-context long-context long-context-base base-model demo-base seesaw-base reward-model clean gpu-check gpu-wheels

setup:
	bash launch/setup_env.sh

demo: setup
	$(BIN)/megatron-rl train configs/demo_cpu.yaml

lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck:
	$(BIN)/mypy

# Tests: tests/unit (in-process and fast, ~1 min on 2 cores) and tests/integration (anything
# that starts processes, servers, torchrun, Slurm or the sandbox, trains through the CLI, or is
# slow). `unit` is every test, both folders in one pytest run: what `make test` (and CI) runs.
unit:
	$(BIN)/python -m pytest -q -ra

unit-fast:
	$(BIN)/python -m pytest -q -ra tests/unit

integration:
	$(BIN)/python -m pytest -q -ra tests/integration

test: setup lint typecheck unit

test-fast: setup lint unit-fast

bench: setup
	$(BIN)/python -m benchmarks.run_all

# The domain scheduler in real training (not part of `make bench`), pre-registered in
# docs/scheduler.md: the core arms on 6 report seeds, the ablations and the seesaw pair's
# arms on 3, on the tinysched/* domains, then the second domain set's headroom study
# (D1 showed no headroom); writes benchmarks/studies/scheduler_real.json.gz (per-run extract +
# statistics, gzip) and its PNGs, then recomputes the statistics from the extract. ~4 h on 2
# shared cores.
bench-scheduler: setup
	$(BIN)/python -m benchmarks.studies.scheduler_real --part core
	$(BIN)/python -m benchmarks.studies.scheduler_real --part ablations
	$(BIN)/python -m benchmarks.studies.scheduler_real --part core --set D2
	$(MAKE) seesaw-base
	$(BIN)/python -m benchmarks.studies.scheduler_real --part seesaw
	$(BIN)/python -m benchmarks.studies.scheduler_stats

# Long-context RL steps at CP=2 vs CP=1 on CPU (memory per rank, step time), merged into
# benchmarks/results.json as long_context.cp2_vs_cp1.
bench-long-context: setup
	$(BIN)/python -m benchmarks.run_all --only long_context

# Long-context RL that learns (issue 27): GRPO on the retrieval family from models/tiny-long-sft,
# length curriculum from 512 tokens, two CPU processes under torchrun (CP=2 from 4096 tokens, the
# two ranks as data parallelism below); held-out accuracy per length level before/after in
# runs/long_context_cpu/summary.json, recorded in benchmarks/studies/long_context_learning.json
# and docs/long_context_learning.png.
long-context: setup
	OMP_NUM_THREADS=1 $(BIN)/python -m torch.distributed.run --standalone --nproc-per-node 2 \
		-m launch.cli train configs/long_context_cpu.yaml
	$(BIN)/python -m benchmarks.studies.long_context_learning runs/long_context_cpu

# Reproduce the long-context warm start models/tiny-long-sft: SFT of models/tiny-base-long on
# short digit_needle documents (training split only; 300 steps read the first 4,800 of the file's
# 12,000, whose lengths grow from 100 to 329 characters).
long-context-base: setup
	$(BIN)/python -m long_context.sft_data runs/long_sft_data.jsonl --n 12000 --chars 100 400 \
		--kinds digit_needle
	OMP_NUM_THREADS=1 $(BIN)/megatron-rl sft configs/long_sft.yaml
	mkdir -p models/tiny-long-sft
	cp runs/long_sft/hf/* models/tiny-long-sft/

# The GPU paths one GPU can check, in <= 5 min, with no set-up step (tests/gpu/gpu_check.py):
# runs from the machine's own python (torch + transformers) plus the wheels `make gpu-wheels`
# put in gpu_wheels/ (carry that folder along); checks it cannot run are listed as unrun.
GPU_PY ?= $(shell test -x $(BIN)/python && echo $(BIN)/python || echo python3)
gpu-check:
	mkdir -p benchmarks/out
	timeout 300 $(GPU_PY) tests/gpu/gpu_check.py --json benchmarks/out/gpu_check.json

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

# The seesaw pair's base models/tiny-seesaw-base (benchmarks/studies/scheduler_pair.py): a
# continued SFT of models/tiny-base on a 50/50 mix of the GCD and the GCD plus 100
# (configs/seesaw_base_sft.yaml, 200 steps on one thread, ~75 s).
seesaw-base: setup
	$(BIN)/megatron-rl sft configs/seesaw_base_sft.yaml
	rm -rf models/tiny-seesaw-base && cp -r runs/seesaw_base_sft/hf models/tiny-seesaw-base

# Reproduce the shipped tiny base model (SFT from scratch on reasoning-gym tasks).
base-model: setup
	$(BIN)/megatron-rl sft configs/base_sft.yaml
	rm -rf models/tiny-base && cp -r runs/base_sft/hf models/tiny-base

# Reproduce the demo's base models/tiny-demo-base: a continued SFT of models/tiny-base that adds
# spelling words backward (configs/demo_base_sft.yaml, 700 steps on one thread, ~5 min).
demo-base: setup
	$(BIN)/megatron-rl sft configs/demo_base_sft.yaml
	rm -rf models/tiny-demo-base && cp -r runs/demo_base_sft/hf models/tiny-demo-base

# The tiny reward models of issue 38 (megatron_rl/rewards/train_rm.py), both started from
# models/tiny-demo-base: models/tiny-rm scores a spelling answer's reversal against near misses
# and degenerate strings; models/tiny-rm-hackable also overrates long and repeated answers (the
# hacking experiment). Training split only; ~15 min each on an idle core.
reward-model: setup
	$(BIN)/python -m megatron_rl.rewards.train_rm --out models/tiny-rm
	$(BIN)/python -m megatron_rl.rewards.train_rm --out models/tiny-rm-hackable --bias repetition

clean:
	rm -rf runs .pytest_cache .mypy_cache .ruff_cache
