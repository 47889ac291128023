"""Shared-prefix packing (``megatron_rl.packing.batch.pack_groups``) equals plain packing.

A GRPO group's samples share their prompt. Shared-prefix rows hold the prompt once, then each
response attending to it (``megatron_rl/model/attention.py``: varlen attention with a prefix
segment, RoPE by per-token position). Everything the trainer computes from them must equal plain
packing (one sequence per sample) within fp32 rounding: log-probs and entropies at two
temperatures and at per-token temperatures, and the gradient of every parameter.

Each check also has teeth against the two ways it could be silently wrong:
- the prefix computed once per sample (plain packing under another name) would give equal
  numbers, so every test asserts the row holds each prompt once and that the transformer layers
  ran over exactly that many tokens (a hook on the first layer);
- RoPE positions restarting in every segment (megatron-core's default THD RoPE) is shown to
  change the log-probs by far more than the tolerance.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from conftest import tiny_model_config
from prefix_data import (
    TEMPS,
    compare_per_sample,
    expected_tokens,
    layouts,
    main_grads,
    make_groups,
    rows_seen,
    segment_local_positions,
)

from megatron_rl.packing.batch import (
    group_bins,
    group_tokens,
    pack_groups,
    sample_rows,
)

CFG = tiny_model_config(max_position_embeddings=256)


@pytest.fixture(scope="module")
def policy(dist1: Any) -> Any:
    from megatron_rl.config.train import TrainConfig
    from megatron_rl.model.policy import Policy

    torch.manual_seed(0)
    return Policy(CFG, dist1, TrainConfig(lr=1e-3, grad_clip=0.0))


def test_layout_holds_each_prompt_once() -> None:
    d = make_groups(CFG.vocab_size)
    plain, shared = layouts(d, temps=True)
    assert shared.num_tokens == expected_tokens(d) < plain.num_tokens
    assert shared.shared_prefix and not plain.shared_prefix
    # positions continue from the prompt's end in every response segment
    for rows_p, rows_s in zip(sample_rows(plain).values(), sample_rows(shared).values(),
                              strict=True):  # fmt: skip
        assert shared.position_ids[rows_s].tolist() == list(range(rows_p.numel()))
        assert torch.equal(plain.tokens[rows_p], shared.tokens[rows_s])
    # the loss mask and every extra land on the same sample tokens
    for key in ("adv", "rollout_lp"):
        a, b = plain.extras[key], shared.extras[key]
        assert compare_per_sample(plain, shared, a, b, d["plens"]) == 0.0
    assert compare_per_sample(plain, shared, plain.loss_mask, shared.loss_mask, d["plens"]) == 0.0
    assert float(plain.loss_mask.sum()) == float(shared.loss_mask.sum())


def test_pack_groups_refuses_what_cannot_be_shared() -> None:
    d = make_groups(CFG.vocab_size)
    bad = [list(s) for s in d["seqs"]]
    bad[1][0] = (bad[1][0] + 1) % CFG.vocab_size
    with pytest.raises(ValueError, match="does not start with its group's prompt"):
        pack_groups(bad, d["masks"], d["groups"], d["plens"])
    masks = [list(m) for m in d["masks"]]
    masks[0][3] = 1.0
    with pytest.raises(ValueError, match="trains prompt tokens"):
        pack_groups(d["seqs"], masks, d["groups"], d["plens"])
    temps = [list(t) for t in d["extras"]["temp"]]
    temps[1] = [0.5] * len(temps[1])
    with pytest.raises(ValueError, match="extra 'temp'"):
        pack_groups(d["seqs"], d["masks"], d["groups"], d["plens"], {"temp": temps})


def test_group_bins_split_a_group_over_budget() -> None:
    lens, plens = [30, 32, 31, 29, 5], [20, 20, 20, 20, 3]
    bins = group_bins([[0, 1, 2, 3], [4]], lens, plens, budget=45)
    chunks = [c for b in bins for c in b]
    assert sorted(i for c in chunks for i in c) == [0, 1, 2, 3, 4]
    for b in bins:  # every row fits, each chunk carrying its own copy of the prompt
        assert sum(group_tokens([lens[i] for i in c], plens[c[0]]) for c in b) <= 45
    assert len([c for c in chunks if 0 in c or 3 in c]) >= 2


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_logprobs_and_entropy_equal_plain_packing(policy: Any, temperature: float) -> None:
    d = make_groups(CFG.vocab_size)
    plain, shared = layouts(d, temps=False)
    with rows_seen(policy) as seen:
        ((lp_s, ent_s),) = policy.token_logprobs([shared], temperature, with_entropy=True)
    assert seen == [expected_tokens(d)]  # the layers ran over each prompt once
    ((lp_p, ent_p),) = policy.token_logprobs([plain], temperature, with_entropy=True)
    assert compare_per_sample(plain, shared, lp_p, lp_s, d["plens"]) < 1e-5
    assert compare_per_sample(plain, shared, ent_p, ent_s, d["plens"]) < 1e-5
    # teeth: RoPE positions restarting in every segment change the result
    restarted = pack_groups(d["seqs"], d["masks"], d["groups"], d["plens"])
    restarted.position_ids = segment_local_positions(restarted)
    ((lp_r, _),) = policy.token_logprobs([restarted], temperature)
    assert compare_per_sample(plain, restarted, lp_p, lp_r, d["plens"]) > 1e-3


def test_grads_equal_plain_packing_per_token_temperature(policy: Any) -> None:
    d = make_groups(CFG.vocab_size, seed=1)
    plain, shared = layouts(d, temps=True)
    ((lp_p, ent_p),) = policy.token_logprobs([plain], with_entropy=True)
    ((lp_s, ent_s),) = policy.token_logprobs([shared], with_entropy=True)
    assert compare_per_sample(plain, shared, lp_p, lp_s, d["plens"]) < 1e-5
    assert compare_per_sample(plain, shared, ent_p, ent_s, d["plens"]) < 1e-5
    n = float(plain.loss_mask.sum())
    g_plain = main_grads(policy, [plain], n)
    with rows_seen(policy) as seen:
        g_shared = main_grads(policy, [shared], n)
    assert seen == [expected_tokens(d)]
    assert g_plain.keys() == g_shared.keys() and len(g_plain) >= 10
    assert sum(float(g.abs().sum()) for g in g_plain.values()) > 0
    for name, g in g_plain.items():
        err = float((g - g_shared[name]).abs().max())
        assert err < 1e-5, f"{name}: max abs diff {err:.2e}"
    # split over two rows (a group per row boundary) it is the same gradient
    bins = group_bins(d["groups"], [len(s) for s in d["seqs"]], d["plens"], budget=60)
    assert len(bins) >= 2
    rows = [pack_groups(d["seqs"], d["masks"], b, d["plens"], d["extras"]) for b in bins]
    g_rows = main_grads(policy, rows, n)
    assert max(float((g - g_rows[k]).abs().max()) for k, g in g_plain.items()) < 1e-5


def rl_groups(seed: int = 2) -> list[Any]:
    """Scored GRPO groups of 4 as the rollout phase returns them (prompts of 2-14 tokens)."""
    from megatron_rl.rollout.groups import Group, Sample
    from megatron_rl.scheduler import GroupSpec

    d = make_groups(CFG.vocab_size, seed=seed, sizes=[4, 4, 4, 4])
    rng = random.Random(seed)
    groups = []
    for members, temp in zip(d["groups"], TEMPS, strict=True):
        g = Group(GroupSpec("d", 0, temp), None)  # type: ignore[arg-type]
        for i in members:
            p = d["plens"][i]
            resp = d["seqs"][i][p:]
            lps = [-4.0 - 2 * rng.random() for _ in resp]  # around the model's ~-4.8: TIS bites
            mask = d["masks"][i][p:]
            g.samples.append(Sample("d", d["seqs"][i][:p], resp, lps, mask, "x", "stop",
                                    float(rng.random() > 0.5)))  # fmt: skip
        g.samples[0].reward, g.samples[1].reward = 1.0, 0.0  # every group has signal
        groups.append(g)
    return groups


def test_rl_step_weights_equal_plain_packing(policy: Any) -> None:
    """One RL step (TIS, KL to a reference as a loss, entropy bonus, per-token temperatures)
    from the same weights: the weights after it agree within 1e-5, packed either way."""
    from megatron_rl.config import load_config
    from megatron_rl.controller.batches import build_batches
    from megatron_rl.losses import global_normalizer
    from megatron_rl.train.step import train_step

    cfg = load_config(None, ["rl.kl_coef=0.1", "rl.kl_estimator=k3", "rl.entropy_coef=0.01",
                             "rl.tis_cap=1.5", "train.lr=1e-3", "train.grad_clip=1.0"])  # fmt: skip
    cfg.train.adam_eps = 1e-4  # Adam's first step is ~lr * sign(g): keep rounding from flipping
    groups, kept = rl_groups(), [0, 1, 2, 3]
    start, opt0 = policy.model_state_shard(), policy.optimizer_state()
    perturbed = {k: v + 0.01 * torch.randn_like(v) for k, v in start.items()}
    out = {}
    for shared in (False, True):
        shares, _ = build_batches(groups, kept, "grpo", budget=80, shared_prefix=shared)
        batches = shares[0]
        policy.load_model_state_shard(perturbed)  # the reference: other weights, so KL != 0
        ref_lp = [lp for lp, _ in policy.token_logprobs(batches)]
        policy.load_model_state_shard(start)
        norm = global_normalizer(shares, cfg.rl.loss_agg)
        with rows_seen(policy) as seen:
            metrics = train_step(policy, cfg, batches, 0, ref_lp, norm)
        out[shared] = (policy.model_state_shard(), metrics, sum(seen), len(batches))
        policy.load_model_state_shard(start)
        policy.load_optimizer_state(opt0)
    (w_plain, m_plain, t_plain, _), (w_shared, m_shared, t_shared, n_rows) = out[False], out[True]
    once = sum(group_tokens([len(s.prompt_ids) + len(s.response_ids) for s in g.samples],
                            len(g.samples[0].prompt_ids)) for g in groups)  # fmt: skip
    assert n_rows >= 2 and t_shared == once < t_plain  # the layers ran over each prompt once
    assert m_shared["train/response_tokens"] == m_plain["train/response_tokens"]
    for key in ("loss/total", "loss/kl", "loss/entropy", "loss/tis_weight_mean", "loss/pg"):
        assert m_shared[key] == pytest.approx(m_plain[key], abs=1e-6), key
    assert abs(m_plain["loss/kl"]) > 1e-4 and m_plain["loss/tis_clip_frac"] > 0
    moved = max(float((w_plain[k] - start[k]).abs().max()) for k in start)
    assert moved > 1e-4
    for k in start:
        err = float((w_plain[k] - w_shared[k]).abs().max())
        assert err < 1e-5, f"{k}: {err:.2e}"


def test_te_spec_falls_back_to_plain_packing_with_one_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Under Transformer Engine's spec (GPU) the RL step packs one sequence per sample and says
    so once; the local spec (CPU) shares prefixes; off is off."""
    from megatron_rl.controller import batches as rl_step

    assert rl_step.shared_prefix_enabled(True) and not rl_step.shared_prefix_enabled(False)
    monkeypatch.setattr(rl_step, "use_te_spec", lambda: True)
    with caplog.at_level("INFO", logger="megatron_rl.controller.batches"):
        assert not rl_step.shared_prefix_enabled(True)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "packing one sequence per sample" in lines[0]
    shares, _ = rl_step.build_batches(rl_groups(), [0, 1], "grpo", budget=1000, shared_prefix=False)
    assert not any(b.shared_prefix for b in shares[0])


def test_routing_replay_packs_plainly_with_one_line(caplog: pytest.LogCaptureFixture) -> None:
    """Replayed expert routes are per-token rows pack_groups does not share: a routing-replay
    run packs one sequence per sample and says so once (local spec, shared_prefix on)."""
    from megatron_rl.controller import batches as rl_step

    with caplog.at_level("INFO", logger="megatron_rl.controller.batches"):
        assert not rl_step.shared_prefix_enabled(True, routing_replay=True)
        assert not rl_step.shared_prefix_enabled(False, routing_replay=True)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "rl.routing_replay" in lines[0]
