"""Both CPU rollout engines serve Qwen3 (QK-norm) and Qwen3-MoE: log-probs equal an fp32
``transformers`` forward, and a weight update in HF layout (per-expert tensors for the MoE, as
the trainer exports them) reaches the engine.

Models: random tiny Qwen3 / Qwen3-MoE (hidden 128, 2 heads of 64, 2 layers; the MoE with 8
experts of width 64, top-2) with the project tokenizer. One engine per (kind, model); vLLM's
start-up is 10-50 s on 2 cores. vLLM on CPU cannot return routed experts (its V2 model runner
needs Triton), and it refuses to update an MoE's weights in place (vLLM 0.32's CPU reload
leaves the prepacked experts wrong; see ``vllm_engine.py``): both refusals are checked here.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from benchmarks.tiny_model import make_tiny_qwen3
from megatron_rl.model import hf_io
from megatron_rl.rollout.base import EngineStartError, GenRequest, RolloutEngine, SamplingParams
from megatron_rl.rollout.build import build_engine as build
from megatron_rl.rollout.config import RolloutConfig
from megatron_rl.rollout.weight_sync import sync_weights

# as tests/integration/test_rollout_engines.py: fp32 kernels differ by ~1e-5 at most
FP32_BOUND = 1e-4


@pytest.fixture(scope="module", params=["qwen3", "qwen3_moe"])
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp(request.param) / "model"
    return make_tiny_qwen3(out, "test", seed=0, moe=request.param == "qwen3_moe")


@pytest.fixture(scope="module", params=["hf", "vllm"])
def engine(request: pytest.FixtureRequest, model_dir: Path) -> Iterator[RolloutEngine]:
    torch.set_num_threads(1)
    if request.param == "vllm":
        pytest.importorskip("vllm")
    eng = build(RolloutConfig(engine=request.param, kv_cache_gb=1, max_batch=32), str(model_dir), 0)
    yield eng
    eng.shutdown()


def _max_error(engine: RolloutEngine, model_dir: Path) -> float:
    prompts = [[(5 * i + 3 * j) % 250 for j in range(36 + i)] for i in range(3)]
    reqs = [GenRequest(p, SamplingParams(temperature=0.8, max_tokens=12, n=2, seed=i))
            for i, p in enumerate(prompts)]  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    err = 0.0
    for p, cs in zip(prompts, engine.generate(reqs), strict=True):
        for c in cs:
            with torch.no_grad():
                logits = model(torch.tensor([p + c.token_ids])).logits[0, len(p) - 1 : -1]
            ref = torch.log_softmax(logits / 0.8, -1).gather(-1, torch.tensor(c.token_ids)[:, None])
            err = max(err, (ref[:, 0] - torch.tensor(c.logprobs)).abs().max().item())
    return err


def test_logprobs_match_transformers_before_and_after_a_weight_update(
    engine: RolloutEngine, model_dir: Path, tmp_path: Path
) -> None:
    assert _max_error(engine, model_dir) < FP32_BOUND
    sd, cfg = hf_io.load_hf(model_dir)
    gen = torch.Generator().manual_seed(1)
    new = {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in sd.items()}
    new_dir = hf_io.save_hf(tmp_path / "new", new, cfg, tokenizer_from=model_dir)
    assert _max_error(engine, new_dir) > 1e-2  # the update is big enough to be seen ...
    if getattr(engine, "frozen_moe", False):  # vLLM CPU: its in-place MoE reload is wrong
        with pytest.raises(ValueError, match="cannot update a mixture-of-experts") as err:
            sync_weights(engine, new, "memory", tmp_path / "sync")
        assert "\n" not in str(err.value)
        assert _max_error(engine, model_dir) < FP32_BOUND  # nothing was half-loaded
        return
    sync_weights(engine, new, "memory", tmp_path / "sync")
    assert _max_error(engine, new_dir) < FP32_BOUND  # ... and the engine now serves it


def test_vllm_on_cpu_refuses_routed_experts(model_dir: Path) -> None:
    pytest.importorskip("vllm")
    if torch.cuda.is_available():
        pytest.skip("vLLM returns routed experts on GPU")
    cfg = RolloutConfig(engine="vllm", return_routed_experts=True)
    with pytest.raises(EngineStartError, match="cannot return routed experts on CPU"):
        build(cfg, str(model_dir), 0)
