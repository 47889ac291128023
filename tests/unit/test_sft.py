"""SFT: response-only loss on packed batches, checkpoint + resume, shipped HF output."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from megatron_rl.config import load_config
from megatron_rl.model.tokenizer import build_tokenizer
from megatron_rl.train.sft import make_microbatches

ROOT = Path(__file__).resolve().parents[2]


def _cfg(tmp: Path, steps: int, data: Path):
    return load_config(
        ROOT / "configs/base_sft.yaml",
        [
            f"output_dir={tmp}",
            "run_name=sft",
            f"sft.data={data}",
            f"train.steps={steps}",
            "train.threads=1",
            "train.warmup_steps=0",
            "train.lr=3e-3",
            "sft.batch_size=8",
            "sft.eval_samples_per_task=2",
            "sft.eval_every=0",
            "model.num_layers=2",
            "model.hidden_size=64",
            "model.num_attention_heads=1",
            "model.ffn_hidden_size=128",
            "tracking.wandb=disabled",
            "tracking.progress=false",
            "checkpoint.every=1",
            "domains.include=['tiny/chain_sum']",
            "rollout.max_new_tokens=4",
        ],
    )


def test_microbatches_mask_prompts_and_respect_budget() -> None:
    tok = build_tokenizer()
    ex = [([1, 2, 3], [7, 256]), ([4, 5], [8, 9, 256]), ([6], [256])]
    batches = make_microbatches(ex, budget=6)
    assert all(b.num_tokens <= 6 for b in batches)
    seen = sorted(i for b in batches for i in b.seq_ids)
    assert seen == [0, 1, 2]
    for b in batches:
        for i, (p, r) in zip(b.seq_ids, _split(b), strict=True):
            assert p == ex[i][0] + ex[i][1] and r == [0.0] * len(ex[i][0]) + [1.0] * len(ex[i][1])
    assert tok.eos_token_id == 256


def _split(b):
    lens = b.seq_lens()
    toks = torch.split(b.tokens, lens)
    masks = torch.split(b.loss_mask, lens)
    return [(t.tolist(), m.tolist()) for t, m in zip(toks, masks, strict=True)]


def test_sft_learns_resumes_and_exports(tmp_path: Path) -> None:
    from megatron_rl.train.sft import train_sft

    data = tmp_path / "pairs.jsonl"
    rows = [{"prompt": f"echo {i % 7}", "response": str(i % 7)} for i in range(64)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    train_sft(_cfg(tmp_path, 3, data))
    train_sft(_cfg(tmp_path, 6, data))  # extends the same run: resumes after step 2
    run = tmp_path / "sft"
    rows_ = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r["sft/loss"] for r in rows_ if "sft/loss" in r]
    assert [r["step"] for r in rows_ if "sft/loss" in r] == list(range(6))
    assert losses[-1] < losses[0]
    model = AutoModelForCausalLM.from_pretrained(run / "hf")
    assert sum(p.numel() for p in model.parameters()) > 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 6 and "tiny/chain_sum" in summary["eval_accuracy"]
