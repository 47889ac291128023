"""Contract tests every rollout engine must pass, run on the ``hf`` and ``vllm`` engines.

One engine per module and kind (vLLM start-up takes ~10-50 s on 2 cores). The model is a random
tiny Qwen2 (hidden 128, 2 heads of 64, 2 layers, vocab 300) with the project tokenizer; some
tests load hand-made weights whose next-token distribution is known in closed form.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from benchmarks.tiny_model import make_tiny_qwen2
from megatron_rl.rollout.base import Completion, GenRequest, RolloutEngine, SamplingParams
from megatron_rl.rollout.build import build_engine as build
from megatron_rl.rollout.config import RolloutConfig
from megatron_rl.rollout.hf_engine import nucleus_filter
from megatron_rl.rollout.weight_sync import sync_weights

# fp32 bound on |engine log-prob - plain transformers forward|. Both compute the same fp32 math;
# they differ only in kernel order (batched/padded or paged attention vs one unpadded sequence),
# which moves logits of magnitude ~10 by ~1e-6..1e-5 (measured: 1.5e-5 hf, 2e-5 vLLM). 1e-4
# leaves margin, yet a wrong temperature, stale KV or bf16 would be off by > 1e-2 (asserted below).
FP32_BOUND = 1e-4
VOCAB = 300
BUMP = 5.0  # logit of the favoured token in the closed-form model; all others are 0


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_qwen2(tmp_path_factory.mktemp("tiny") / "model", "test", seed=0)


@pytest.fixture(scope="module", params=["hf", "vllm", "hf-own-process"])
def engine(request: pytest.FixtureRequest, model_dir: Path) -> Iterator[RolloutEngine]:
    torch.set_num_threads(1)
    if request.param == "vllm":
        pytest.importorskip("vllm")
    name, _, own = request.param.partition("-")  # hf-own-process: the hf engine in a child
    cfg = RolloutConfig(engine=name, kv_cache_gb=1, max_batch=64, process="own" if own else "same")
    eng = build(cfg, str(model_dir), seed=0)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(str(model_dir))


def reference_model(
    model_dir: Path, state: dict[str, torch.Tensor] | None = None
) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    if state is not None:
        model.load_state_dict(state)
    return model


@torch.no_grad()
def reference_logprobs(
    model: torch.nn.Module, prompt: list[int], c: Completion, temp: float
) -> torch.Tensor:
    """log_softmax(logits / T) of the completion's tokens from one unbatched forward. [len]"""
    ids = torch.tensor([prompt + c.token_ids])
    logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    logp = torch.log_softmax(logits / temp, dim=-1)
    return logp.gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]


def prompts(k: int, length: int = 40) -> list[list[int]]:
    """Distinct prompts; > 16 tokens so vLLM caches full prefix blocks."""
    return [[(7 * i + 3 * j) % 250 for j in range(length + i)] for i in range(k)]


def closed_form_state(model_dir: Path, favoured: int) -> dict[str, torch.Tensor]:
    """Weights whose logits are BUMP for ``favoured`` and 0 for every other token, always.

    Attention and MLP outputs are zeroed, so the residual stream is the embedding (all rows
    ones); the final RMSNorm maps it to ~ones, and lm_head reads ``favoured`` only.
    """
    state = {k: v.clone() for k, v in reference_model(model_dir).state_dict().items()}
    for name, t in state.items():
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            t.zero_()
    hidden = state["model.embed_tokens.weight"].shape[1]
    state["model.embed_tokens.weight"].fill_(1.0)
    state["model.norm.weight"].fill_(1.0)
    state["lm_head.weight"].zero_()
    state["lm_head.weight"][favoured].fill_(BUMP / hidden)
    return state


def closed_form_logprob(favoured: bool, temp: float) -> float:
    z = BUMP / temp
    return (z if favoured else 0.0) - math.log(math.exp(z) + VOCAB - 1)


def test_n_completions_with_consistent_shapes(engine: RolloutEngine) -> None:
    reqs = [
        GenRequest(p, SamplingParams(temperature=1.0, max_tokens=12, n=n, seed=i))
        for i, (p, n) in enumerate(zip(prompts(3), [1, 3, 2], strict=True))
    ]
    out = engine.generate(reqs)
    assert [len(cs) for cs in out] == [1, 3, 2]
    for cs in out:
        for c in cs:
            assert 1 <= len(c.token_ids) <= 12
            assert len(c.logprobs) == len(c.token_ids)
            assert all(0 <= t < VOCAB for t in c.token_ids)
            assert all(lp <= 0 and math.isfinite(lp) for lp in c.logprobs)
            assert c.finish_reason == ("length" if len(c.token_ids) == 12 else "stop")
    assert engine.generate([]) == []


@pytest.mark.parametrize("temp", [1.0, 0.7])
def test_logprobs_match_transformers(engine: RolloutEngine, model_dir: Path, temp: float) -> None:
    ps = prompts(4)
    reqs = [
        GenRequest(p, SamplingParams(temperature=temp, max_tokens=16, n=3, seed=i))
        for i, p in enumerate(ps)
    ]
    out = engine.generate(reqs)
    model = reference_model(model_dir)
    err, raw_gap = 0.0, 0.0
    for p, cs in zip(ps, out, strict=True):
        for c in cs:
            ref = reference_logprobs(model, p, c, temp)
            err = max(err, (ref - torch.tensor(c.logprobs)).abs().max().item())
            raw_gap = max(raw_gap, (reference_logprobs(model, p, c, 1.0) - ref).abs().max().item())
    assert err < FP32_BOUND
    if temp != 1.0:  # the test can tell tempered from raw log-probs
        assert raw_gap > 1e-2


def test_top_p_logprobs_renormalise_over_the_nucleus(
    engine: RolloutEngine, model_dir: Path
) -> None:
    ps = prompts(2)
    reqs = [
        GenRequest(p, SamplingParams(top_p=0.6, max_tokens=6, n=4, seed=i))
        for i, p in enumerate(ps)
    ]
    model = reference_model(model_dir)
    for p, cs in zip(ps, engine.generate(reqs), strict=True):
        for c in cs:
            with torch.no_grad():
                logits = model(torch.tensor([p + c.token_ids])).logits[0, len(p) - 1 : -1]
            kept = torch.isfinite(nucleus_filter(logits, 0.6))
            probs = torch.softmax(logits, dim=-1)
            tok = torch.tensor(c.token_ids)
            assert kept.gather(-1, tok[:, None]).all()  # never samples outside the nucleus
            want = torch.log(probs.gather(-1, tok[:, None])[:, 0] / (probs * kept).sum(-1))
            assert (want - torch.tensor(c.logprobs)).abs().max().item() < FP32_BOUND


def test_seeds_reproduce(engine: RolloutEngine) -> None:
    def run(seed: int) -> list[list[int]]:
        req = GenRequest(prompts(1)[0], SamplingParams(max_tokens=16, n=4, seed=seed))
        return [c.token_ids for c in engine.generate([req])[0]]

    first = run(11)
    assert run(11) == first
    assert run(12) != first
    assert len({tuple(t) for t in first}) > 1  # the n samples of a group differ


def test_update_weights_reaches_cached_prefixes(engine: RolloutEngine, model_dir: Path) -> None:
    ps = prompts(2, length=48)
    reqs = [GenRequest(p, SamplingParams(max_tokens=8, n=2, seed=i)) for i, p in enumerate(ps)]
    engine.generate(reqs)  # fills the prefix cache with old-weight KV
    new = {
        k: v * 1.3 if k.endswith("proj.weight") else v.clone()
        for k, v in reference_model(model_dir).state_dict().items()
    }
    metrics = sync_weights(engine, new, mode="memory")
    assert metrics["sync/seconds"] > 0 and metrics["sync/bytes"] > 1e6
    out = engine.generate(reqs)
    assert engine.stats["rollout/cached_prompt_tokens"] > 0  # the prefix path was exercised
    old_model, new_model = reference_model(model_dir), reference_model(model_dir, new)
    err, gap = 0.0, 0.0
    for p, cs in zip(ps, out, strict=True):
        for c in cs:
            ref = reference_logprobs(new_model, p, c, 1.0)
            err = max(err, (ref - torch.tensor(c.logprobs)).abs().max().item())
            gap = max(gap, (reference_logprobs(old_model, p, c, 1.0) - ref).abs().max().item())
    assert gap > 1e-2  # old weights (or old KV) would be detected
    assert err < FP32_BOUND


def test_closed_form_model_eos_and_greedy(
    engine: RolloutEngine, model_dir: Path, tmp_path: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    eos = tokenizer.eos_token_id
    state = closed_form_state(model_dir, favoured=eos)
    info = sync_weights(engine, state, mode="disk", dir=tmp_path / "sync")
    assert (tmp_path / "sync" / "model.safetensors").is_file()
    assert info["sync/write_seconds"] > 0
    reqs = [
        GenRequest(p, SamplingParams(temperature=t, max_tokens=40, n=4, seed=1))
        for p, t in zip(prompts(2), [1.0, 1.5], strict=True)
    ]
    for req, cs in zip(reqs, engine.generate(reqs), strict=True):
        for c in cs:
            # p(EOS) = e^5 / (e^5 + 299) ~ 0.33 per token: every sample ends at EOS, kept.
            assert c.finish_reason == "stop" and c.token_ids[-1] == eos
            assert eos not in c.token_ids[:-1]
            t = req.params.temperature
            want = [closed_form_logprob(tok == eos, t) for tok in c.token_ids]
            assert c.logprobs == pytest.approx(want, abs=1e-4)
            assert "<|end|>" not in c.text
    greedy = engine.generate(
        [GenRequest(prompts(1)[0], SamplingParams(temperature=0, max_tokens=5))]
    )
    (c,) = greedy[0]
    assert c.token_ids == [eos] and c.finish_reason == "stop"
    assert c.logprobs[0] == pytest.approx(closed_form_logprob(True, 1.0), abs=1e-4)


def test_stop_strings_and_stop_tokens(
    engine: RolloutEngine, model_dir: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    (a,) = tokenizer.encode("a", add_special_tokens=False)
    state = closed_form_state(model_dir, favoured=a)
    state["lm_head.weight"][a] *= 6  # logit 30: 'a' every time
    engine.update_weights(state)
    p = prompts(1)[0]
    by_string = GenRequest(p, SamplingParams(max_tokens=10, stop=["aaa"], seed=0))
    by_token = GenRequest(p, SamplingParams(max_tokens=10, stop_token_ids=[a], seed=0))
    no_stop = GenRequest(p, SamplingParams(max_tokens=6, seed=0))
    out = engine.generate([by_string, by_token, no_stop])
    s, t, n = out[0][0], out[1][0], out[2][0]
    assert (s.token_ids, s.text, s.finish_reason) == ([a, a, a], "", "stop")
    assert (t.token_ids, t.finish_reason) == ([a], "stop")
    assert (n.token_ids, n.text, n.finish_reason) == ([a] * 6, "aaaaaa", "length")
    engine.update_weights_from_disk(str(model_dir))  # back to the random model
    reqs = [GenRequest(p, SamplingParams(max_tokens=8, seed=3))]
    (c,) = engine.generate(reqs)[0]
    ref = reference_logprobs(reference_model(model_dir), p, c, 1.0)
    assert (ref - torch.tensor(c.logprobs)).abs().max().item() < FP32_BOUND


def test_bad_requests_name_the_request(engine: RolloutEngine) -> None:
    with pytest.raises(ValueError, match="request 1.*empty prompt"):
        engine.generate(
            [GenRequest([1, 2], SamplingParams()), GenRequest([], SamplingParams(), tag="x")]
        )
    with pytest.raises(ValueError, match="outside"):
        engine.generate([GenRequest([1, VOCAB + 5], SamplingParams())])
    with pytest.raises(ValueError, match="n must be"):
        engine.generate([GenRequest([1, 2], SamplingParams(n=0))])
