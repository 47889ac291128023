"""Rollout routing replay on the shipped tiny MoE (models/tiny-moe): the engine returns the
experts it chose, the trainer replays them, and replay cuts the train/inference mismatch.

How the batch where routing differs is made: the engine (the hf engine, fp32) computes its
router logits in bf16, as a bf16 serving engine does (HF's Qwen3-MoE router is one
``F.linear`` in the model dtype), while the trainer's router runs in fp32; about 1% of the
(token, layer) choices then differ (0.9% on this batch). Everything else of the engine stays
fp32, so with the engine's choices replayed the only difference left is the bf16 rounding of
the routing weights. (With the *whole* engine in bf16 the mismatch of the bf16 experts and attention
dominates: replay then cuts the mean only ~1.6x on this model; docs/LOG.md has both.)
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from benchmarks.studies.routing_replay import bf16_router, measure, pack_rollout
from megatron_rl.controller.batches import sample_routes
from megatron_rl.controller.shares import zero_batch
from megatron_rl.model import hf_io
from megatron_rl.model.moe import ROUTES_KEY
from megatron_rl.packing.batch import pack
from megatron_rl.rollout.base import EngineStartError, GenRequest, SamplingParams
from megatron_rl.rollout.config import RolloutConfig
from megatron_rl.rollout.groups import Sample
from megatron_rl.rollout.hf_engine import HFEngine

TINY_MOE = Path(__file__).resolve().parents[2] / "models" / "tiny-moe"
LAYERS, TOPK = 4, 2


def requests(seed: int, n_prompts: int = 6) -> list[GenRequest]:
    g = torch.Generator().manual_seed(seed)
    return [GenRequest(torch.randint(0, 256, (int(5 + 3 * (i % 3)),), generator=g).tolist(),
                       SamplingParams(n=4, max_tokens=20, temperature=1.0, seed=i))
            for i in range(n_prompts)]  # fmt: skip


def engine(max_batch: int = 64) -> HFEngine:
    torch.set_num_threads(1)
    return HFEngine(
        RolloutConfig(return_routed_experts=True, max_batch=max_batch), str(TINY_MOE), 0
    )


def test_engine_returns_the_experts_of_every_token_it_ran() -> None:
    """Prefill (left-padded, shared by a group) and decode rows, finished rows riding along:
    each completion's routes equal a fresh forward of prompt + completion but its last token."""
    eng = engine(max_batch=6)  # several chunks; rows finish (EOS / length) at different steps
    reqs = requests(seed=3)
    model = AutoModelForCausalLM.from_pretrained(TINY_MOE).eval()
    seen: list[torch.Tensor] = []
    for layer in model.model.layers:
        layer.mlp.gate.register_forward_hook(lambda m, a, out: seen.append(out[2]))
    lengths = set()
    for req, outs in zip(reqs, eng.generate(reqs), strict=True):
        for c in outs:
            seq = req.prompt_ids + c.token_ids
            seen.clear()
            with torch.no_grad():
                model(torch.tensor([seq]))
            ref = torch.stack(seen, dim=1)[: len(seq) - 1]
            assert c.routed_experts is not None and c.routed_experts.shape == (len(seq) - 1, 4, 2)
            assert torch.equal(c.routed_experts.sort(-1).values, ref.sort(-1).values.int())
            lengths.add(len(c.token_ids))
    assert len(lengths) > 1  # completions of different lengths were compared


def test_engine_on_a_dense_model_refuses_routed_experts(tmp_path: Path) -> None:
    from benchmarks.tiny_model import make_tiny_qwen3

    dense = make_tiny_qwen3(tmp_path / "dense", "test")
    with pytest.raises(EngineStartError, match="needs an MoE model") as err:
        HFEngine(RolloutConfig(return_routed_experts=True), str(dense), 0)
    assert "\n" not in str(err.value)


def test_engine_takes_per_expert_weights(tmp_path: Path) -> None:
    """Weight sync sends HF's per-expert layout; the engine fuses it into transformers 5's."""
    eng = engine()
    sd, cfg = hf_io.load_hf(TINY_MOE)
    new = {k: v * 1.5 if ".experts.3." in k else v for k, v in sd.items()}
    eng.update_weights(new)
    hf_io.save_hf(tmp_path / "new", new, cfg, tokenizer_from=TINY_MOE)
    ref = AutoModelForCausalLM.from_pretrained(tmp_path / "new").eval()
    own = eng.model.state_dict()
    for name, t in ref.state_dict().items():
        assert torch.equal(own[name], t), name
    with pytest.raises(ValueError, match=r"missing expert weight\(s\)"):
        eng.update_weights({k: v for k, v in sd.items() if "layers.2.mlp.experts.5.up" not in k})


def test_sample_routes_rows_and_zero_batch() -> None:
    routes = torch.randint(0, 8, (6, LAYERS, TOPK))
    s = Sample(
        "d", [1, 2, 3], [4, 5, 6, 7], [0.0] * 4, [1.0] * 4, "", "stop", routed_experts=routes
    )
    rows = sample_routes(s)
    assert rows.shape == (7, LAYERS * TOPK)
    assert torch.equal(rows[:6].view(6, LAYERS, TOPK).long(), routes)
    assert rows[6].tolist() == [0.0, 1.0] * LAYERS  # the last token: distinct placeholders
    batch = pack([[1, 2, 3, 4, 5, 6, 7]], [[0.0] * 7], extras={ROUTES_KEY: [rows]})
    assert torch.equal(batch.extras[ROUTES_KEY], rows)
    assert zero_batch({ROUTES_KEY: rows[0], "temp": 1.0}).extras[ROUTES_KEY].shape == (1, 8)
    short = replace(s, routed_experts=routes[:4])
    with pytest.raises(ValueError, match=r"shape \(4, 4, 2\); expected \[6, layers, top-k\]"):
        sample_routes(short)


@pytest.fixture(scope="module")
def policy():
    from megatron_rl.model.config import ParallelConfig
    from megatron_rl.model.parallel import destroy_distributed, init_distributed
    from megatron_rl.model.policy import Policy

    torch.set_num_threads(1)
    sd, cfg = hf_io.load_hf(TINY_MOE)
    info = init_distributed(ParallelConfig(), seed=0)
    pol = Policy(cfg, info)
    pol.load_hf_state_dict(sd)
    yield pol
    destroy_distributed()


def test_policy_replays_the_routes_it_is_given(policy) -> None:
    tokens = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    policy.replay.record()
    free = policy.logits(tokens)
    own = policy.replay.recorded()  # [S*B, L, k], sequence-major
    policy.replay.record(False)
    own = own.view(12, 2, LAYERS, TOPK).transpose(0, 1)
    assert torch.equal(policy.logits(tokens, own), free)  # its own choices: the same function
    other = (own + 1) % 8  # every token to other experts
    assert (policy.logits(tokens, other) - free).abs().max() > 1e-3


def _rollout_batch(eng: HFEngine) -> tuple[object, int]:
    """Generate, then pack prompt + completion with the engine's log-probs and routes."""
    reqs = requests(seed=0, n_prompts=8)
    batch = pack_rollout(reqs, eng.generate(reqs))
    return batch, len(batch.seq_ids)


def test_replay_cuts_the_mismatch_tenfold(policy) -> None:
    eng = engine()
    for layer in eng.model.model.layers:
        bf16_router(layer.mlp.gate)
    batch, n = _rollout_batch(eng)
    m = measure(policy, batch)
    print(f"routing replay, {n} samples, bf16 router in the engine: {m}")
    assert 0.9 < m["agreement"] < 0.995  # routing differs on a few percent of choices
    assert m["free_mean"] >= 10 * m["replay_mean"]
    assert m["free_max"] > m["replay_max"]


def test_with_the_same_router_precision_replay_changes_nothing(policy) -> None:
    """Control: an fp32 engine routes as the trainer does, so both mismatches are fp32 noise."""
    batch, _ = _rollout_batch(engine())
    m = measure(policy, batch)
    assert m["agreement"] == 1.0
    assert m["free_mean"] == pytest.approx(m["replay_mean"], abs=1e-7) and m["replay_max"] < 1e-5
