"""Varlen attention for packed rows (``megatron_rl/model/attention.py``) equals the dense path.

The dense reference is what the CPU path did before: one ``[T, T]`` block-diagonal causal mask
built from ``cu_seqlens``. The varlen path takes Megatron's THD ``PackedSeqParams``, the interface
Transformer Engine's ``TEDotProductAttention`` serves on GPU (megatron-core 0.16.1
``transformer/attention.py`` squeezes q/k/v to ``[t, heads, dim]`` for ``qkv_format == "thd"``
and ``models/common/embeddings/rope_utils.py::_apply_rotary_pos_emb_thd`` restarts RoPE at 0 in
every sequence). Outputs and gradients must agree within fp32 tolerance, at the level of the
attention function and of the whole megatron-core GPTModel.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_model_config

from megatron_rl.model.attention import _plan, varlen_attention

LENS = [5, 17, 1, 9, 30, 28, 2]  # several length buckets, a 1-token sequence


def cu_of(lens: list[int]) -> torch.Tensor:
    return torch.tensor([0, *lens]).cumsum(0)


def dense_attention(q, k, v, cu: torch.Tensor) -> torch.Tensor:
    """Reference: SDPA over the whole row with a block-diagonal causal mask."""
    lens = (cu[1:] - cu[:-1]).long()
    seg = torch.repeat_interleave(torch.arange(lens.numel()), lens)
    t = torch.arange(seg.numel())
    allowed = (seg[:, None] == seg[None]) & (t[None] <= t[:, None])
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=allowed
    )
    return out.transpose(0, 1)


@pytest.mark.parametrize("heads,groups", [(4, 4), (4, 2), (2, 1)])
def test_varlen_equals_dense_values_and_grads(heads: int, groups: int) -> None:
    torch.manual_seed(0)
    total, cu = sum(LENS), cu_of(LENS)
    q = torch.randn(total, heads, 16, requires_grad=True)
    k = torch.randn(total, groups, 16, requires_grad=True)
    v = torch.randn(total, groups, 16, requires_grad=True)
    out, ref = varlen_attention(q, k, v, cu), dense_attention(q, k, v, cu)
    assert out.shape == (total, heads, 16)
    assert float((out - ref).abs().max()) < 1e-5
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g)
    for a, b in zip(*grads, strict=True):
        assert float((a - b).abs().max()) < 1e-5
    # each sequence alone gives its slice of the row (no leakage across sequences)
    i = 4
    s, e = int(cu[i]), int(cu[i + 1])
    alone = varlen_attention(q[s:e], k[s:e], v[s:e], torch.tensor([0, e - s]))
    assert float((alone - out[s:e]).abs().max()) < 1e-6


def test_plan_buckets_by_length_and_costs_sum_of_squares() -> None:
    lengths = (100, 10, 90, 12, 50)
    plan, inverse = _plan(lengths, "cpu")
    widths = [tuple(g.shape) for g, _ in plan]
    assert widths == [(2, 100), (1, 50), (2, 12)]  # 100 & 90; 50; 12 & 10
    scores = sum(n * w * w for n, w in widths)
    assert scores == 2 * 100**2 + 50**2 + 2 * 12**2 < sum(lengths) ** 2 / 3
    assert sorted(inverse.tolist()) == list(range(sum(lengths)))
    with pytest.raises(ValueError, match="cu_seqlens"):
        varlen_attention(torch.zeros(5, 1, 4), torch.zeros(5, 1, 4), torch.zeros(5, 1, 4),
                         torch.tensor([0, 3]))  # fmt: skip


def test_gpt_model_thd_equals_dense_mask_logits_and_grads(dist1) -> None:
    """The local-spec GPTModel with PackedSeqParams == the same model with the dense mask."""
    from megatron_rl.model.gpt import block_causal_mask, build_gpt_model, thd_params

    cfg = tiny_model_config(num_attention_heads=4, num_query_groups=2, ffn_hidden_size=96)
    model = build_gpt_model(cfg, pre_process=True, post_process=True)
    rng = random.Random(0)
    tokens = torch.tensor([[rng.randrange(cfg.vocab_size) for _ in range(sum(LENS))]])
    cu = cu_of(LENS)
    pos = torch.arange(tokens.shape[1])[None]

    def run(**inputs):
        model.zero_grad(set_to_none=True)
        logits = model(tokens, pos, **inputs)
        (logits.float().log_softmax(-1)[..., 3].sum()).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        return logits.detach(), grads

    dense_logits, dense_grads = run(attention_mask=block_causal_mask(cu, tokens.shape[1]))
    thd_logits, thd_grads = run(attention_mask=None, packed_seq_params=thd_params(cu))
    assert float((dense_logits - thd_logits).abs().max()) < 1e-5
    assert dense_grads.keys() == thd_grads.keys() and len(dense_grads) > 0
    for name, g in dense_grads.items():  # fp32 tolerance relative to the grad's size
        scale = max(1.0, float(g.abs().max()))
        assert float((g - thd_grads[name]).abs().max()) < 1e-5 * scale, name
    # teeth: without the packing (one causal row) the logits differ
    one_row, _ = run(attention_mask=None, packed_seq_params=thd_params(cu[[0, -1]]))
    assert float((one_row - thd_logits).abs().max()) > 1e-3
