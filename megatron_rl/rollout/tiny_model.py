"""Random Qwen2 checkpoints in HF layout, for engine tests and benchmarks.

Nothing is downloaded: the model is built from a ``Qwen2Config`` with a fixed seed and saved
with the project's byte-level tokenizer (:mod:`megatron_rl.model.tokenizer`). The vocabulary is
padded past the tokenizer's 262 ids, as the real tiny model is; a random model samples padding
ids too, which the engines must (and do) handle.

Head size defaults to 64: the vLLM CPU attention kernels accept 32 and 64 but not 16.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from megatron_rl.model.tokenizer import build_tokenizer, save_tokenizer

# Named sizes used by tests and benchmarks/rollout_engines.py.
SIZES: dict[str, dict[str, int]] = {
    "test": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, vocab_size=300),
    "3m": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, vocab_size=320),
    "20m": dict(hidden_size=512, num_hidden_layers=6, num_attention_heads=8, vocab_size=320),
    "100m": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, vocab_size=320),
}


def make_tiny_qwen2(
    out_dir: str | Path,
    size: str = "test",
    seed: int = 0,
    tie_embeddings: bool = False,
    init_std: float = 0.2,
) -> Path:
    """Write a random Qwen2 (config, safetensors, tokenizer) to ``out_dir`` and return it.

    ``init_std`` is larger than a real init so that a random model's next-token distributions
    are far from uniform: tests then see distinct tokens and log-probs well below log(1/V).
    """
    if size not in SIZES:
        raise ValueError(f"unknown tiny model size {size!r}; choose one of {sorted(SIZES)}")
    dims = SIZES[size]
    tok = build_tokenizer()
    assert dims["vocab_size"] >= len(tok), "model vocabulary must cover the tokenizer"
    hidden, heads = dims["hidden_size"], dims["num_attention_heads"]
    kwargs: dict[str, Any] = dict(
        dims,
        intermediate_size=3 * hidden,
        num_key_value_heads=heads,
        head_dim=hidden // heads,
        max_position_embeddings=1024,
        tie_word_embeddings=tie_embeddings,
        initializer_range=init_std,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
        dtype="float32",
    )
    cfg = Qwen2Config(**kwargs)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg).eval()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    save_tokenizer(out)
    return out


def count_parameters(model_dir: str | Path) -> int:
    """Number of parameters of the HF checkpoint in ``model_dir`` (tied weights once)."""
    from safetensors import safe_open

    total = 0
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for key in st.keys():
                total += _numel(st, key)
    return total


def _numel(st: object, key: str) -> int:
    shape = st.get_slice(key).get_shape()  # type: ignore[attr-defined]
    n = 1
    for d in shape:
        n *= int(d)
    return n
