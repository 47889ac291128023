"""Rollout pieces outside the engine contract: registry, start-up errors, sampling helpers,
batching of the hf engine, atomic weight files, and tied-embedding weight updates."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from benchmarks.tiny_model import make_tiny_qwen2
from megatron_rl.rollout.base import (
    ENGINES,
    EngineStartError,
    GenRequest,
    SamplingParams,
    derive_seed,
)
from megatron_rl.rollout.build import build_engine
from megatron_rl.rollout.config import RolloutConfig
from megatron_rl.rollout.hf_engine import nucleus_filter
from megatron_rl.rollout.weight_sync import sync_weights, write_safetensors


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_qwen2(tmp_path_factory.mktemp("tiny") / "model", "test", seed=1)


def test_registry_lists_engines_on_unknown_name(model_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"engine='trt'.*choose one of \[.*'hf'.*'vllm'.*\]"):
        build_engine(RolloutConfig(engine="trt"), str(model_dir), seed=0)
    assert {"hf", "vllm"} <= set(ENGINES)


def test_hf_start_failure_names_engine_and_cause(tmp_path: Path) -> None:
    with pytest.raises(EngineStartError, match=r"'hf'.*does-not-exist"):
        build_engine(RolloutConfig(engine="hf"), str(tmp_path / "does-not-exist"), seed=0)


def test_vllm_start_failure_names_engine_and_cause(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    (tmp_path / "config.json").write_text('{"model_type": "no_such_arch"}')
    with pytest.raises(EngineStartError, match=r"rollout engine 'vllm' failed to start on .*"):
        build_engine(RolloutConfig(engine="vllm", kv_cache_gb=1), str(tmp_path), seed=0)


def test_nucleus_filter_by_hand() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = torch.isfinite(nucleus_filter(logits, 0.7))
    assert kept.tolist() == [[True, True, False, False]]  # 0.5 < 0.7, 0.5 + 0.3 >= 0.7
    assert torch.isfinite(nucleus_filter(logits, 1.0)).all()
    assert torch.isfinite(nucleus_filter(logits, 0.1)).tolist() == [[True, False, False, False]]


def test_top_p_logprobs_are_renormalised_over_the_nucleus(model_dir: Path) -> None:
    engine = build_engine(RolloutConfig(engine="hf"), str(model_dir), seed=0)
    req = GenRequest([5, 6, 7], SamplingParams(top_p=0.5, max_tokens=1, n=16, seed=0))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        probs = torch.softmax(model(torch.tensor([[5, 6, 7]])).logits[0, -1], -1)
    sorted_p, order = probs.sort(descending=True)
    nucleus = order[: int(((sorted_p.cumsum(0) - sorted_p) < 0.5).sum())]
    for c in engine.generate([req])[0]:
        assert c.token_ids[0] in nucleus.tolist()
        want = torch.log(probs[c.token_ids[0]] / probs[nucleus].sum())
        assert c.logprobs[0] == pytest.approx(want.item(), abs=1e-5)


def test_hf_results_do_not_depend_on_batch_chunking(model_dir: Path) -> None:
    reqs = [
        GenRequest([3 + i] * (5 + i), SamplingParams(max_tokens=10, n=3, seed=i)) for i in range(5)
    ]
    small = build_engine(RolloutConfig(engine="hf", max_batch=4), str(model_dir), seed=0)
    large = build_engine(RolloutConfig(engine="hf", max_batch=64), str(model_dir), seed=0)
    a, b = small.generate(reqs), large.generate(reqs)
    assert [[c.token_ids for c in cs] for cs in a] == [[c.token_ids for c in cs] for cs in b]
    for ca, cb in zip(sum(a, []), sum(b, []), strict=True):
        assert ca.logprobs == pytest.approx(cb.logprobs, abs=1e-4)
    assert small.stats["rollout/generated_tokens"] == sum(len(c.token_ids) for c in sum(a, []))
    assert small.stats["rollout/cached_prompt_tokens"] == sum(2 * (5 + i) for i in range(5))


def test_unseeded_requests_follow_the_engine_seed(model_dir: Path) -> None:
    reqs = [GenRequest([9, 8, 7], SamplingParams(max_tokens=12, n=2))]
    one = build_engine(RolloutConfig(engine="hf"), str(model_dir), seed=5)
    two = build_engine(RolloutConfig(engine="hf"), str(model_dir), seed=5)
    first = [c.token_ids for c in one.generate(reqs)[0]]
    assert first == [c.token_ids for c in two.generate(reqs)[0]]
    assert first != [c.token_ids for c in one.generate(reqs)[0]]  # next call, next seed
    assert derive_seed(5, 0, 0) != derive_seed(5, 0, 1) != derive_seed(5, 1, 0)


def test_write_safetensors_is_atomic(tmp_path: Path) -> None:
    good = {"a": torch.ones(3), "b": torch.zeros(2, 2)}
    path = write_safetensors(good, tmp_path)
    with pytest.raises(Exception):  # noqa: B017 - whatever safetensors raises for a non-tensor
        write_safetensors({"a": torch.full((3,), 7.0), "b": "not a tensor"}, tmp_path)  # type: ignore[dict-item]
    assert torch.equal(load_file(str(path))["a"], torch.ones(3))  # old file intact
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]  # no temp left over
    tied = torch.arange(4.0)
    write_safetensors({"x": tied, "y": tied}, tmp_path)  # shared storage is written twice
    assert torch.equal(load_file(str(path))["y"], tied)


def test_sync_weights_rejects_bad_mode_and_missing_dir(model_dir: Path) -> None:
    engine = build_engine(RolloutConfig(engine="hf"), str(model_dir), seed=0)
    with pytest.raises(ValueError, match="dir="):
        sync_weights(engine, {}, mode="disk")
    with pytest.raises(ValueError, match="'memory' or 'disk'"):
        sync_weights(engine, {}, mode="nfs")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unexpected.*bogus"):
        engine.update_weights({"bogus": torch.zeros(1)})


@pytest.mark.parametrize("name", ["hf", "vllm"])
def test_tied_embeddings_update_reaches_the_output_layer(tmp_path: Path, name: str) -> None:
    """A converter may send only embed_tokens for a tied model; the output layer must follow."""
    if name == "vllm":
        pytest.importorskip("vllm")
    torch.set_num_threads(1)
    tied_dir = make_tiny_qwen2(tmp_path / "tied", "test", seed=2, tie_embeddings=True)
    model = AutoModelForCausalLM.from_pretrained(str(tied_dir), dtype=torch.float32).eval()
    state = {k: v.clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    state["model.embed_tokens.weight"] *= 1.5
    model.load_state_dict(state, strict=False)
    assert torch.equal(model.lm_head.weight, state["model.embed_tokens.weight"])
    engine = build_engine(RolloutConfig(engine=name, kv_cache_gb=1), str(tied_dir), seed=0)
    try:
        engine.update_weights(state)
        prompt = [4, 5, 6, 7]
        (c,) = engine.generate([GenRequest(prompt, SamplingParams(max_tokens=8, seed=0))])[0]
    finally:
        engine.shutdown()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + c.token_ids])).logits[0, len(prompt) - 1 : -1]
    ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]
    assert (ref - torch.tensor(c.logprobs)).abs().max().item() < 1e-4


def test_hf_prefills_a_repeated_prompt_once_with_unchanged_samples(model_dir: Path) -> None:
    """The SGLang client sends each sample of a group as its own request: the engine shares the
    prompt's prefill across them (counted as cached) and samples exactly as one at a time."""
    a, b = [5, 6, 7, 8, 9, 10], [11, 12, 13]
    reqs = [
        GenRequest(p, SamplingParams(max_tokens=6, seed=s)) for p, s in [(a, 1), (a, 2), (b, 3)]
    ]
    engine = build_engine(RolloutConfig(engine="hf"), str(model_dir), seed=0)
    together = engine.generate(reqs)
    assert engine.stats["rollout/cached_prompt_tokens"] == len(a)
    alone = [engine.generate([r])[0] for r in reqs]
    for t, s in zip(together, alone, strict=True):
        assert t[0].token_ids == s[0].token_ids
        assert t[0].logprobs == pytest.approx(s[0].logprobs, abs=1e-4)
