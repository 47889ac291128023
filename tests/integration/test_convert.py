"""HF <-> Megatron converter: exact round trips, the sharded layouts, logits, and bad input.

Tiny random Llama (tied embeddings, no QKV bias) and Qwen2 (untied, QKV bias) models are built
with ``transformers`` from a config (no download), every parameter (norms and biases included)
randomised so that a swapped or mis-split tensor changes the numbers. Conversions go through the
real CLI (``launch.cli.main`` in-process; one bad-input case and the TP=2 logits as subprocesses).
"""

from __future__ import annotations

import dataclasses
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
    AutoConfig,
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from launch import cli
from megatron_rl.model import convert, hf_io

REPO = Path(__file__).resolve().parents[2]
TOKENIZER_FILES = {
    "tokenizer.json": '{"version": "1.0", "model": {"type": "WordLevel", "vocab": {"a": 0}}}',
    "tokenizer_config.json": '{"model_max_length": 64}',
    "generation_config.json": '{"bos_token_id": 1, "eos_token_id": 2, "temperature": 0.7}',
}


def _make_hf(path: Path, arch: str, dtype: torch.dtype = torch.float32) -> Path:
    """A random tiny HF checkpoint with tokenizer/generation files; returns its directory."""
    kwargs: dict[str, Any] = dict(vocab_size=128, hidden_size=64, num_hidden_layers=4,
                                  num_key_value_heads=2, bos_token_id=1, eos_token_id=2,
                                  max_position_embeddings=256)  # fmt: skip
    model: PreTrainedModel
    if arch == "qwen2":
        kwargs.update(intermediate_size=96, num_attention_heads=4, rope_theta=50000.0)
        model = Qwen2ForCausalLM(Qwen2Config(tie_word_embeddings=False, **kwargs))
    else:
        kwargs.update(intermediate_size=128, num_attention_heads=8, rms_norm_eps=1e-5)
        model = LlamaForCausalLM(LlamaConfig(tie_word_embeddings=True, **kwargs))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            offset = 1.0 if "norm" in name else 0.0
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1 + offset)
    torch.nn.Module.to(model, dtype).save_pretrained(path)
    for name, text in TOKENIZER_FILES.items():
        (path / name).write_text(text)
    return path


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("hf")
    return {arch: _make_hf(root / arch, arch) for arch in ("qwen2", "llama")}


def _tensors(d: Path) -> dict[str, torch.Tensor]:
    return safetensors.torch.load_file(str(d / "model.safetensors"))


@pytest.mark.parametrize(("arch", "tp", "pp"), [
    ("qwen2", 1, 1), ("qwen2", 2, 1), ("qwen2", 2, 2), ("llama", 1, 1), ("llama", 2, 2),
    ("llama", 1, 4),
])  # fmt: skip
def test_cli_round_trip_is_bit_exact(hf_dirs, tmp_path, arch, tp, pp):
    src = hf_dirs[arch]
    meg, back = tmp_path / "meg", tmp_path / "back"
    args = ["--hf", str(src), "--out", str(meg), "--tp", str(tp), "--pp", str(pp)]
    assert cli.main(["convert", "hf-to-megatron", *args]) == 0
    assert sorted(p.name for p in meg.glob("mp_rank_*")) == sorted(
        f"mp_rank_{t:02d}_{p:03d}" for t in range(tp) for p in range(pp)
    )
    assert cli.main(["convert", "megatron-to-hf", "--ckpt", str(meg), "--out", str(back)]) == 0
    orig, got = _tensors(src), _tensors(back)
    assert sorted(got) == sorted(orig)
    for name, t in orig.items():
        assert got[name].dtype == t.dtype and torch.equal(got[name], t), name
    src_cfg = json.loads((src / "config.json").read_text())
    back_cfg = json.loads((back / "config.json").read_text())
    for key in ("architectures", "model_type", "hidden_size", "intermediate_size",
                "num_attention_heads", "num_key_value_heads", "num_hidden_layers", "rms_norm_eps",
                "vocab_size", "max_position_embeddings", "tie_word_embeddings", "bos_token_id",
                "eos_token_id"):  # fmt: skip
        assert back_cfg[key] == src_cfg[key], key
    assert back_cfg["rope_parameters"]["rope_theta"] == src_cfg["rope_parameters"]["rope_theta"]
    for name, text in TOKENIZER_FILES.items():
        assert (back / name).read_text() == text, name
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_round_trip_output_loads_in_transformers_with_identical_logits(hf_dirs, tmp_path, arch):
    meg, back = tmp_path / "meg", tmp_path / "back"
    assert cli.main(["convert", "hf-to-megatron", "--hf", str(hf_dirs[arch]), "--out", str(meg),
                     "--tp", "2"]) == 0  # fmt: skip
    assert cli.main(["convert", "megatron-to-hf", "--ckpt", str(meg), "--out", str(back)]) == 0
    tokens = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = AutoModelForCausalLM.from_pretrained(hf_dirs[arch]).eval()(tokens).logits
        got = AutoModelForCausalLM.from_pretrained(back).eval()(tokens).logits
    assert torch.equal(got, ref)


# ----------------------------------------------------------------------------------------------
# the shard layout, checked against an independent head-by-head construction


def test_qkv_is_grouped_per_query_group_and_split_over_tp(hf_dirs):
    sd, cfg = hf_io.load_hf(hf_dirs["qwen2"])  # 4 heads, 2 groups, head_dim 16
    d, heads_per_group = cfg.head_dim, cfg.num_attention_heads // cfg.num_query_groups
    for tp_rank in range(2):
        shard = convert.hf_to_megatron_rank(sd, cfg, tp=2, tp_rank=tp_rank)
        for kind in ("weight", "bias"):
            q, k, v = (sd[f"model.layers.3.self_attn.{n}_proj.{kind}"] for n in "qkv")
            group = tp_rank  # one query group per TP rank
            rows = [q[(group * heads_per_group + h) * d:(group * heads_per_group + h + 1) * d]
                    for h in range(heads_per_group)]  # fmt: skip
            rows += [k[group * d : (group + 1) * d], v[group * d : (group + 1) * d]]
            expected = torch.cat(rows, dim=0)
            got = shard[f"decoder.layers.3.self_attention.linear_qkv.{kind}"]
            assert torch.equal(got, expected), (tp_rank, kind)


def test_mlp_and_row_parallel_splits(hf_dirs):
    sd, cfg = hf_io.load_hf(hf_dirs["qwen2"])  # ffn 96, hidden 64, vocab 128
    for r in range(2):
        shard = convert.hf_to_megatron_rank(sd, cfg, tp=2, tp_rank=r)
        fc1 = shard["decoder.layers.0.mlp.linear_fc1.weight"]
        assert torch.equal(
            fc1[:48], sd["model.layers.0.mlp.gate_proj.weight"][48 * r : 48 * (r + 1)]
        )
        assert torch.equal(fc1[48:], sd["model.layers.0.mlp.up_proj.weight"][48 * r : 48 * (r + 1)])
        fc2 = shard["decoder.layers.0.mlp.linear_fc2.weight"]
        assert torch.equal(fc2, sd["model.layers.0.mlp.down_proj.weight"][:, 48 * r : 48 * (r + 1)])
        proj = shard["decoder.layers.0.self_attention.linear_proj.weight"]
        assert torch.equal(
            proj, sd["model.layers.0.self_attn.o_proj.weight"][:, 32 * r : 32 * (r + 1)]
        )
        emb, out = shard["embedding.word_embeddings.weight"], shard["output_layer.weight"]
        assert torch.equal(emb, sd["model.embed_tokens.weight"][64 * r : 64 * (r + 1)])
        assert torch.equal(out, sd["lm_head.weight"][64 * r : 64 * (r + 1)])
        norm = shard["decoder.layers.0.input_layernorm.weight"]
        assert torch.equal(norm, sd["model.layers.0.input_layernorm.weight"])  # replicated


def test_pipeline_stages_number_layers_locally_and_place_ends(hf_dirs):
    sd, cfg = hf_io.load_hf(hf_dirs["llama"])  # 4 layers, tied embeddings
    first = convert.hf_to_megatron_rank(sd, cfg, pp=2, pp_rank=0)
    last = convert.hf_to_megatron_rank(sd, cfg, pp=2, pp_rank=1)
    assert "embedding.word_embeddings.weight" in first and "decoder.final_layernorm.weight" in last
    assert "embedding.word_embeddings.weight" not in last and "output_layer.weight" not in first
    assert {k.split(".")[2] for k in last if k.startswith("decoder.layers.")} == {"0", "1"}
    assert torch.equal(last["decoder.layers.0.input_layernorm.weight"],
                       sd["model.layers.2.input_layernorm.weight"])  # fmt: skip
    # tied: the last stage keeps a copy of the embedding at PP>1, and none at PP=1
    assert torch.equal(last["output_layer.weight"], sd["model.embed_tokens.weight"])
    assert "output_layer.weight" not in convert.hf_to_megatron_rank(sd, cfg)
    assert "lm_head.weight" not in convert.megatron_to_hf({(0, 0): first, (0, 1): last}, cfg, 1, 2)


def test_te_spec_naming_round_trips_and_extra_state_is_ignored(hf_dirs):
    sd, cfg = hf_io.load_hf(hf_dirs["qwen2"])
    shards = convert.hf_to_megatron(sd, cfg, tp=2, pp=1, spec="te")
    assert "decoder.layers.1.self_attention.linear_qkv.layer_norm_weight" in shards[(0, 0)]
    assert "decoder.layers.1.mlp.linear_fc1.layer_norm_weight" in shards[(1, 0)]
    assert not any("input_layernorm" in k for k in shards[(0, 0)])
    for shard in shards.values():
        shard["decoder.layers.0.self_attention.linear_qkv._extra_state"] = torch.zeros(3)
    back = convert.megatron_to_hf(shards, cfg, tp=2, pp=1)
    assert back.keys() == sd.keys() and all(torch.equal(back[k], sd[k]) for k in sd)


def test_bf16_round_trip_is_bit_exact(tmp_path):
    sd, cfg = hf_io.load_hf(_make_hf(tmp_path / "bf16", "llama", torch.bfloat16))
    assert cfg.dtype == "bfloat16" and sd["model.norm.weight"].dtype == torch.bfloat16
    back = convert.megatron_to_hf(convert.hf_to_megatron(sd, cfg, tp=2, pp=2), cfg, 2, 2)
    assert all(back[k].dtype == torch.bfloat16 and torch.equal(back[k], sd[k]) for k in sd)


def test_unexpected_megatron_tensor_is_named(hf_dirs):
    sd, cfg = hf_io.load_hf(hf_dirs["llama"])
    shards = convert.hf_to_megatron(sd, cfg)
    shards[(0, 0)]["decoder.layers.0.self_attention.linear_qkv.bias"] = torch.zeros(128)
    with pytest.raises(ValueError, match="linear_qkv.bias"):
        convert.megatron_to_hf(shards, cfg)
    del shards[(0, 0)]["decoder.layers.0.self_attention.linear_qkv.bias"]
    wider = dataclasses.replace(cfg, ffn_hidden_size=256)  # shards hold ffn 128
    with pytest.raises(ValueError, match=r"linear_fc1.weight' has shape \(256, 64\), the config "
                       r"implies \(512, 64\)"):  # fmt: skip
        convert.megatron_to_hf(shards, wider)


# ----------------------------------------------------------------------------------------------
# files and configs


def test_config_mapping_round_trips_and_transformers_reads_ours(hf_dirs, tmp_path):
    for arch in ("qwen2", "llama"):
        raw, cfg = hf_io.load_hf_config(hf_dirs[arch])
        ours = hf_io.hf_config_from_model_config(cfg)
        again = hf_io.model_config_from_hf(ours)
        again.hf_path = cfg.hf_path
        assert again == cfg
        (tmp_path / arch).mkdir()
        (tmp_path / arch / "config.json").write_text(json.dumps(ours))
        hf_cfg = AutoModelForCausalLM.from_config(
            AutoConfig.from_pretrained(tmp_path / arch)
        ).config
        assert hf_cfg.num_key_value_heads == cfg.num_query_groups
        assert hf_cfg.tie_word_embeddings == cfg.tie_embeddings
        rope = getattr(hf_cfg, "rope_parameters", None) or {"rope_theta": hf_cfg.rope_theta}
        assert rope["rope_theta"] == cfg.rotary_base
    _, qwen = hf_io.load_hf_config(hf_dirs["qwen2"])
    assert (qwen.qkv_bias, qwen.rotary_base, qwen.tie_embeddings) == (True, 50000.0, False)
    _, llama = hf_io.load_hf_config(hf_dirs["llama"])
    assert (llama.qkv_bias, llama.norm_epsilon, llama.tie_embeddings) == (False, 1e-5, True)


@pytest.mark.parametrize(("arch", "change", "message"), [
    ("llama", {"attention_bias": True}, "attention_bias"),
    ("qwen2", {"use_sliding_window": True}, "use_sliding_window"),
    ("qwen2", {"hidden_act": "gelu"}, "hidden_act"),
    ("llama", {"head_dim": 16}, "head_dim"),
    ("qwen2", {"num_key_value_heads": 3}, "num_query_groups"),
])  # fmt: skip
def test_configs_we_cannot_express_exactly_are_refused(hf_dirs, arch, change, message):
    config = json.loads((hf_dirs[arch] / "config.json").read_text())
    with pytest.raises(ValueError, match=message):
        hf_io.model_config_from_hf({**config, **change})


def test_sharded_safetensors_index_is_written_and_read(hf_dirs, tmp_path):
    sd, cfg = hf_io.load_hf(hf_dirs["qwen2"])
    out = hf_io.save_hf(tmp_path / "sharded", sd, cfg, max_shard_bytes=200_000)
    files = sorted(p.name for p in out.glob("model-*.safetensors"))
    assert len(files) >= 3 and (out / "model.safetensors.index.json").is_file()
    back, cfg2 = hf_io.load_hf(out)
    assert cfg2.num_layers == cfg.num_layers
    assert back.keys() == sd.keys() and all(torch.equal(back[k], sd[k]) for k in sd)
    assert AutoModelForCausalLM.from_pretrained(out).config.vocab_size == 128


def test_failed_write_leaves_nothing_behind(hf_dirs, tmp_path):
    sd, cfg = hf_io.load_hf(hf_dirs["qwen2"])
    with pytest.raises(ValueError, match="does not exist"):
        hf_io.save_hf(tmp_path / "out", sd, cfg, tokenizer_from=tmp_path / "nope")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_megatron_logits_match_hf_tp1(hf_dirs, arch):
    """The converted shard loaded into M1's Megatron GPTModel (TP=1, in-process, fp32)."""
    from megatron_rl.model.config import ParallelConfig
    from megatron_rl.model.gpt import build_gpt_model
    from megatron_rl.model.parallel import destroy_distributed, init_distributed

    sd, cfg = hf_io.load_hf(hf_dirs[arch])
    init_distributed(ParallelConfig(), seed=0)
    try:
        model = build_gpt_model(cfg, pre_process=True, post_process=True).eval()
        result = model.load_state_dict(convert.hf_to_megatron_rank(sd, cfg), strict=False)
        assert not result.unexpected_keys
        assert all(k.endswith("_extra_state") for k in result.missing_keys)
        tokens = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(2))
        positions = torch.arange(16).expand(2, 16)
        mask = torch.triu(torch.ones(16, 16, dtype=torch.bool), diagonal=1)[None, None]
        device = next(model.parameters()).device  # the GPU on a CUDA machine
        with torch.no_grad():
            got = model(tokens.to(device), positions.to(device), mask.to(device)).cpu()
            ref = AutoModelForCausalLM.from_pretrained(hf_dirs[arch]).eval()(tokens).logits
    finally:
        destroy_distributed()
    assert got.shape == ref.shape == (2, 16, 128)
    assert ref.abs().max() > 0.1  # the comparison is not between near-zero tensors
    assert (got - ref).abs().max() < 1e-4


def _torchrun_logits(hf_dir: Path, tmp_path: Path, tp: int, pp: int) -> dict:
    meg = tmp_path / f"meg_tp{tp}_pp{pp}"
    assert cli.main(["convert", "hf-to-megatron", "--hf", str(hf_dir), "--out", str(meg),
                     "--tp", str(tp), "--pp", str(pp)]) == 0  # fmt: skip
    result = tmp_path / "result.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={tp * pp}",
           "--standalone", str(REPO / "tests/integration/dist/convert_logits.py"),
           "--hf", str(hf_dir), "--ckpt", str(meg), "--result", str(result)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(result.read_text())


def test_megatron_logits_match_hf_tp2(hf_dirs, tmp_path):
    result = _torchrun_logits(hf_dirs["qwen2"], tmp_path, tp=2, pp=1)
    assert result["shape"] == [2, 12, 128] and result["ref_abs_max"] > 0.1
    assert result["max_abs_diff"] < 1e-4


@pytest.mark.slow
def test_megatron_logits_match_hf_tp2_pp2(hf_dirs, tmp_path):
    result = _torchrun_logits(hf_dirs["qwen2"], tmp_path, tp=2, pp=2)
    assert result["max_abs_diff"] < 1e-4


# ----------------------------------------------------------------------------------------------
# bad input: one clear line, exit code 2


def _cli_error(capsys, argv: list[str]) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    return err


def test_missing_directory(capsys, tmp_path):
    err = _cli_error(capsys, ["convert", "hf-to-megatron", "--hf", str(tmp_path / "nope"),
                              "--out", str(tmp_path / "o")])  # fmt: skip
    assert "does not exist" in err and "nope" in err


def test_malformed_and_unsupported_config(capsys, hf_dirs, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    argv = ["convert", "hf-to-megatron", "--hf", str(bad), "--out", str(tmp_path / "o")]
    assert "config.json not found" in _cli_error(capsys, argv)
    (bad / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"],')
    assert "config.json is not valid JSON" in _cli_error(capsys, argv)
    config = json.loads((hf_dirs["qwen2"] / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "architectures": ["GPT2LMHeadModel"]}))
    err = _cli_error(capsys, argv)
    assert "GPT2LMHeadModel" in err and "LlamaForCausalLM" in err and "Qwen2ForCausalLM" in err
    rope = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}
    (bad / "config.json").write_text(json.dumps({**config, "rope_parameters": rope}))
    assert "yarn" in _cli_error(capsys, argv)
    (bad / "config.json").write_text(json.dumps(config))
    assert "no model.safetensors" in _cli_error(capsys, argv)


def test_missing_or_mismatched_tensors_name_the_file(capsys, hf_dirs, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    config = json.loads((hf_dirs["qwen2"] / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "intermediate_size": 128}))
    (bad / "model.safetensors").write_bytes((hf_dirs["qwen2"] / "model.safetensors").read_bytes())
    argv = ["convert", "hf-to-megatron", "--hf", str(bad), "--out", str(tmp_path / "o")]
    err = _cli_error(capsys, argv)
    assert "model.safetensors" in err and "gate_proj" in err and "(128, 64)" in err
    sd = _tensors(hf_dirs["qwen2"])
    del sd["model.norm.weight"]
    safetensors.torch.save_file(sd, str(bad / "model.safetensors"))
    (bad / "config.json").write_text(json.dumps(config))
    assert "missing tensor(s) ['model.norm.weight']" in _cli_error(capsys, argv)
    (bad / "model.safetensors").write_bytes(b"not safetensors")
    assert "not a readable safetensors file" in _cli_error(capsys, argv)


def test_bad_megatron_dir_and_existing_output(capsys, hf_dirs, tmp_path):
    meg = tmp_path / "meg"
    assert cli.main(["convert", "hf-to-megatron", "--hf", str(hf_dirs["llama"]), "--out",
                     str(meg), "--tp", "2"]) == 0  # fmt: skip
    capsys.readouterr()
    err = _cli_error(capsys, ["convert", "hf-to-megatron", "--hf", str(hf_dirs["llama"]),
                              "--out", str(meg)])  # fmt: skip
    assert "already exists" in err
    (meg / "mp_rank_01_000" / "model.safetensors").unlink()
    err = _cli_error(capsys, ["convert", "megatron-to-hf", "--ckpt", str(meg), "--out",
                              str(tmp_path / "o")])  # fmt: skip
    assert "mp_rank_01_000/model.safetensors not found" in err
    assert not (tmp_path / "o").exists()


def test_tp_not_dividing_heads_is_one_line_from_the_real_cli(hf_dirs, tmp_path):
    """A real subprocess of the installed console script: exit 2, one line, no traceback."""
    exe = Path(sys.executable).parent / "megatron-rl"
    cmd = [str(exe), "convert", "hf-to-megatron", "--hf", str(hf_dirs["qwen2"]), "--out",
           str(tmp_path / "o"), "--tp", "3"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("megatron-rl")]
    assert lines == [
        "megatron-rl convert: error: tp=3 must divide num_attention_heads=4; "
        "choose tp among its divisors"
    ]
    assert "Traceback" not in done.stderr and not (tmp_path / "o").exists()


def test_model_package_imports_no_run_config_or_trainer():
    """``megatron_rl/model/`` takes its own config sections: importing all of it (in a fresh
    interpreter) loads neither the root run config nor the trainer, rollout or scheduler: only
    the packed batch (``packing/batch.py``) and the leaf modules ``dataclass_io``, ``durable``."""
    code = ("import sys, pkgutil, importlib, megatron_rl.model as m\n"
            "for info in pkgutil.walk_packages(m.__path__, 'megatron_rl.model.'):\n"
            "    importlib.import_module(info.name)\n"
            "print(sorted(n for n in sys.modules if n.startswith('megatron_rl.')))")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = eval(done.stdout.strip().splitlines()[-1])
    assert "megatron_rl.model.arch.base" in loaded  # the walk did import the package
    outside = [n for n in loaded if not n.startswith("megatron_rl.model")]
    packing = ["megatron_rl.packing", "megatron_rl.packing.batch"]
    assert outside == ["megatron_rl.dataclass_io", "megatron_rl.durable", *packing], outside
