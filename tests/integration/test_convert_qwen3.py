"""Qwen3 (QK-norm) and Qwen3-MoE through the converter: exact round trips, EP/TP shards, logits.

Random checkpoints are built with ``transformers`` (``Qwen3ForCausalLM``,
``Qwen3MoeForCausalLM``) from a config, every parameter randomised (norms and routers
included), and saved in HF's on-disk layout (per-expert tensors). Round trips go through the
real CLI at the layouts of the issue (TP=1/2, PP=1/2, EP=1/2/4, expert-TP 1 or TP) and, as
state-dict functions, over held-out variants: other expert counts, top-k (1 without and 3 with
``norm_topk_prob``), GQA ratios (MQA, MHA), tied embeddings, a ``head_dim`` of its own, bf16,
and Qwen2-MoE (``Qwen2MoeForCausalLM``: QKV bias and a gated shared expert). Logits of the
Megatron model built from the converted shards match transformers within 1e-4.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch
from transformers import (
    AutoModelForCausalLM,
    PreTrainedModel,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from launch import cli
from megatron_rl.model import convert, hf_io

REPO = Path(__file__).resolve().parents[2]
BASE: dict[str, Any] = dict(vocab_size=128, hidden_size=64, num_hidden_layers=4,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                            intermediate_size=96, max_position_embeddings=256, bos_token_id=1,
                            eos_token_id=2, rope_theta=50000.0,
                            tie_word_embeddings=False)  # fmt: skip
MOE: dict[str, Any] = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                           norm_topk_prob=True)  # fmt: skip


def make_hf(path: Path, moe: bool | str, dtype: torch.dtype = torch.float32, **change: Any) -> Path:
    """A random tiny Qwen3 / Qwen3-MoE (``moe="qwen2"``: Qwen2-MoE) checkpoint in ``path``."""
    kwargs = {**BASE, **(MOE if moe else {}), **change}
    model: PreTrainedModel
    if moe == "qwen2":  # Qwen2-MoE: QKV bias, a gated shared expert, no QK-norm
        kwargs = {**kwargs, "shared_expert_intermediate_size": 48}
        kwargs.pop("head_dim")
        model = Qwen2MoeForCausalLM(Qwen2MoeConfig(**kwargs))
    elif moe:
        model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**kwargs))
    else:
        model = Qwen3ForCausalLM(Qwen3Config(**kwargs))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            offset = 1.0 if "norm" in name else 0.0
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1 + offset)
    torch.nn.Module.to(model, dtype).save_pretrained(path)
    (path / "tokenizer_config.json").write_text('{"model_max_length": 64}')
    return path


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("qwen3")
    return {"qwen3": make_hf(root / "qwen3", moe=False),
            "qwen3_moe": make_hf(root / "qwen3_moe", moe=True)}  # fmt: skip


def _tensors(d: Path) -> dict[str, torch.Tensor]:
    return safetensors.torch.load_file(str(d / "model.safetensors"))


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return sorted(a) == sorted(b) and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k])
                                          for k in a)  # fmt: skip


@pytest.mark.parametrize(("arch", "layout", "files"), [
    ("qwen3", ["--tp", "2"], ["mp_rank_00_000", "mp_rank_01_000"]),
    ("qwen3", ["--tp", "2", "--pp", "2", "--spec", "te"], None),
    ("qwen3_moe", ["--ep", "2"], ["mp_rank_00_000_000", "mp_rank_00_000_001"]),
    ("qwen3_moe", ["--tp", "2", "--ep", "2", "--pp", "2"], None),
    ("qwen3_moe", ["--tp", "2", "--ep", "4", "--etp", "1", "--spec", "te"], None),
])  # fmt: skip
def test_cli_round_trip_is_bit_exact(hf_dirs, tmp_path, arch, layout, files):
    src, meg, back = hf_dirs[arch], tmp_path / "meg", tmp_path / "back"
    assert (
        cli.main(["convert", "hf-to-megatron", "--hf", str(src), "--out", str(meg), *layout]) == 0
    )
    if files:
        assert sorted(p.name for p in meg.glob("mp_rank_*")) == files
    assert cli.main(["convert", "megatron-to-hf", "--ckpt", str(meg), "--out", str(back)]) == 0
    assert _same(_tensors(back), _tensors(src))
    src_cfg, back_cfg = (json.loads((d / "config.json").read_text()) for d in (src, back))
    keys = ["architectures", "model_type", "head_dim", "num_key_value_heads", "rms_norm_eps",
            "tie_word_embeddings", "bos_token_id", "eos_token_id"]  # fmt: skip
    if arch == "qwen3_moe":
        keys += ["num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
                 "router_aux_loss_coef"]  # fmt: skip
        assert back_cfg["num_experts"] == src_cfg["num_local_experts"] == 4
    assert {k: back_cfg[k] for k in keys} == {k: src_cfg[k] for k in keys}


@pytest.mark.parametrize(("moe", "change", "layouts"), [
    (False, {"num_key_value_heads": 1}, [(1, 2, 1, 0)]),  # MQA
    (False, {"num_key_value_heads": 4, "tie_word_embeddings": True}, [(2, 1, 1, 0)]),  # MHA, tied
    (False, {"head_dim": 32}, [(2, 2, 1, 0)]),  # heads wider than hidden / heads
    (True, {"num_experts": 6, "num_experts_per_tok": 3}, [(1, 2, 3, 0), (2, 1, 2, 1)]),
    (True, {"num_experts_per_tok": 1, "norm_topk_prob": False}, [(2, 1, 4, 0)]),
    (True, {"num_experts": 8, "num_key_value_heads": 1, "tie_word_embeddings": True},
     [(1, 1, 8, 0), (1, 2, 2, 0)]),
    ("qwen2", {}, [(2, 2, 2, 0), (2, 1, 4, 1)]),  # Qwen2-MoE: the gated shared expert
])  # fmt: skip
def test_held_out_variants_round_trip(tmp_path, moe, change, layouts):
    sd, cfg = hf_io.load_hf(make_hf(tmp_path / "hf", moe, **change))
    assert cfg.head_dim == change.get("head_dim", 16)
    if moe:
        want = (change.get("num_experts", 4), change.get("num_experts_per_tok", 2))
        assert (cfg.moe.num_experts, cfg.moe.topk) == want
    for tp, pp, ep, etp in layouts:
        for spec in ("local", "te"):
            shards = convert.hf_to_megatron(sd, cfg, tp, pp, spec, ep, etp)  # type: ignore[arg-type]
            assert _same(convert.megatron_to_hf(shards, cfg, tp, pp, ep, etp), sd)
    again = hf_io.model_config_from_hf(hf_io.hf_config_from_model_config(cfg))
    again.hf_path = cfg.hf_path
    assert again == cfg


def test_bf16_moe_round_trip(tmp_path):
    sd, cfg = hf_io.load_hf(make_hf(tmp_path / "hf", True, torch.bfloat16))
    assert cfg.dtype == "bfloat16"
    assert _same(convert.megatron_to_hf(convert.hf_to_megatron(sd, cfg, 2, 2, "local", 2),
                                        cfg, 2, 2, 2), sd)  # fmt: skip


def test_experts_are_placed_by_ep_rank_and_split_by_expert_tp(hf_dirs):
    sd, cfg = hf_io.load_hf(hf_dirs["qwen3_moe"])  # 4 experts of width 32
    h = "model.layers.1.mlp."
    for ep_rank in range(2):
        shard = convert.hf_to_megatron_rank(sd, cfg, tp=2, tp_rank=1, ep=2, ep_rank=ep_rank)
        m = "decoder.layers.1.mlp."
        assert torch.equal(shard[m + "router.weight"], sd[h + "gate.weight"])  # replicated
        for j in range(2):  # local expert j of EP rank r is global expert 2r + j
            e, x = 2 * ep_rank + j, f"{m}experts.local_experts.{j}."
            fc1, fc2 = shard[x + "linear_fc1.weight"], shard[x + "linear_fc2.weight"]
            assert torch.equal(fc1[:16], sd[f"{h}experts.{e}.gate_proj.weight"][16:])  # TP rank 1
            assert torch.equal(fc1[16:], sd[f"{h}experts.{e}.up_proj.weight"][16:])
            assert torch.equal(fc2, sd[f"{h}experts.{e}.down_proj.weight"][:, 16:])
        whole = convert.hf_to_megatron_rank(sd, cfg, tp=2, tp_rank=1, ep=2, ep_rank=ep_rank,
                                            etp=1, spec="te")  # fmt: skip
        assert torch.equal(whole[m + "experts.linear_fc2.weight1"],
                           sd[f"{h}experts.{2 * ep_rank + 1}.down_proj.weight"])  # fmt: skip
        assert "decoder.layers.1.pre_mlp_layernorm.weight" in whole  # not fused under TE either
    q_norm = convert.hf_to_megatron_rank(sd, cfg, tp=2, tp_rank=1)
    assert torch.equal(q_norm["decoder.layers.0.self_attention.q_layernorm.weight"],
                       sd["model.layers.0.self_attn.q_norm.weight"])  # fmt: skip


@pytest.mark.parametrize(("moe", "change"), [
    (False, {}),
    (False, {"head_dim": 32, "tie_word_embeddings": True, "num_key_value_heads": 1}),
    (True, {}),
    (True, {"num_experts": 6, "num_experts_per_tok": 3}),
    (True, {"num_experts_per_tok": 1, "norm_topk_prob": False}),
    ("qwen2", {}),
])  # fmt: skip
def test_megatron_logits_match_transformers(tmp_path, moe, change):
    """fp32, TP=1, in-process: the Megatron model built from the converted shard."""
    from megatron_rl.model.config import ParallelConfig
    from megatron_rl.model.gpt import build_gpt_model
    from megatron_rl.model.parallel import destroy_distributed, init_distributed

    hf = make_hf(tmp_path / "hf", moe, **change)
    sd, cfg = hf_io.load_hf(hf)
    init_distributed(ParallelConfig(), seed=0)
    try:
        model = build_gpt_model(cfg, pre_process=True, post_process=True).eval()
        result = model.load_state_dict(convert.hf_to_megatron_rank(sd, cfg), strict=False)
        assert not result.unexpected_keys
        assert all(k.endswith("_extra_state") for k in result.missing_keys)
        tokens = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(2))
        positions = torch.arange(16).expand(2, 16)
        mask = torch.triu(torch.ones(16, 16, dtype=torch.bool), diagonal=1)[None, None]
        device = next(model.parameters()).device
        with torch.no_grad():
            got = model(tokens.to(device), positions.to(device), mask.to(device)).cpu()
            ref = AutoModelForCausalLM.from_pretrained(hf).eval()(tokens).logits
    finally:
        destroy_distributed()
    assert ref.abs().max() > 0.1
    assert (got - ref).abs().max() < 1e-4


@pytest.mark.parametrize(("arch", "layout", "procs"), [
    ("qwen3", ["--tp", "2"], 2), ("qwen3_moe", ["--ep", "2"], 2),
])  # fmt: skip
def test_sharded_files_give_transformers_logits_under_torchrun(hf_dirs, tmp_path, arch, layout,
                                                               procs):  # fmt: skip
    """Each rank loads its own file of the CLI's output (TP slice, or its EP rank's experts)."""
    meg, result = tmp_path / "meg", tmp_path / "result.json"
    hf = hf_dirs[arch]
    assert cli.main(["convert", "hf-to-megatron", "--hf", str(hf), "--out", str(meg), *layout]) == 0
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={procs}",
           "--standalone", str(REPO / "tests/integration/dist/convert_logits.py"), "--hf", str(hf),
           "--ckpt", str(meg), "--result", str(result)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(result.read_text())
    assert out["ref_abs_max"] > 0.1 and out["max_abs_diff"] < 1e-4


# ----------------------------------------------------------------------------------------------
# what cannot be converted exactly: one line


@pytest.mark.parametrize(("moe", "change", "message"), [
    (False, {"attention_bias": True}, "attention_bias"),
    (False, {"use_sliding_window": True}, "use_sliding_window"),
    (True, {"mlp_only_layers": [1]}, "dense layers"),
    (True, {"decoder_sparse_step": 2}, "dense layers"),
    (True, {"num_experts_per_tok": 1, "norm_topk_prob": True}, "topk=1 with norm_topk_prob"),
])  # fmt: skip
def test_unsupported_configs_are_refused(hf_dirs, moe, change, message):
    config = json.loads((hf_dirs["qwen3_moe" if moe else "qwen3"] / "config.json").read_text())
    with pytest.raises(ValueError, match=message) as err:
        hf_io.model_config_from_hf({**config, **change})
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("arch", "layout", "message"), [
    ("qwen3_moe", ["--ep", "3"], "ep=3 must divide moe.num_experts=4"),
    ("qwen3", ["--ep", "2"], "ep=2 needs a mixture-of-experts model"),
    ("qwen3_moe", ["--tp", "2", "--etp", "3"], "etp=3 must be 1 or tp=2"),
])  # fmt: skip
def test_bad_expert_layout_is_one_line(capsys, hf_dirs, tmp_path, arch, layout, message):
    argv = ["convert", "hf-to-megatron", "--hf", str(hf_dirs[arch]), "--out", str(tmp_path / "o")]
    assert cli.main([*argv, *layout]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err
    assert not (tmp_path / "o").exists()


def test_missing_ep_shard_and_stray_expert_are_named(capsys, hf_dirs, tmp_path):
    sd, cfg = hf_io.load_hf(hf_dirs["qwen3_moe"])
    shards = convert.hf_to_megatron(sd, cfg, tp=1, pp=1, ep=2)
    shards[(0, 0, 1)]["decoder.layers.0.mlp.experts.local_experts.2.linear_fc1.weight"] = (
        torch.zeros(64, 64)
    )
    with pytest.raises(ValueError, match="local_experts.2.linear_fc1"):
        convert.megatron_to_hf(shards, cfg, 1, 1, 2)
    meg = tmp_path / "meg"
    assert cli.main(["convert", "hf-to-megatron", "--hf", str(hf_dirs["qwen3_moe"]), "--out",
                     str(meg), "--ep", "2"]) == 0  # fmt: skip
    (meg / "mp_rank_00_000_001" / "model.safetensors").unlink()
    capsys.readouterr()
    argv = ["convert", "megatron-to-hf", "--ckpt", str(meg), "--out", str(tmp_path / "o")]
    assert cli.main(argv) == 2
    assert "mp_rank_00_000_001/model.safetensors not found" in capsys.readouterr().err
