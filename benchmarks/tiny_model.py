"""Random Qwen2 / Qwen3 / Qwen3-MoE checkpoints in HF layout, for engine tests and benchmarks.
Only tests and benchmarks build them, so this lives in benchmarks/, outside the library.

Nothing is downloaded: the model is built from a ``transformers`` config with a fixed seed and
saved with the project's byte-level tokenizer (:mod:`megatron_rl.model.tokenizer`). The
vocabulary is padded past the tokenizer's 262 ids, as the real tiny model is; a random model
samples padding ids too, which the engines must (and do) handle.

Head size defaults to 64: the vLLM CPU attention kernels accept 32 and 64 but not 16.

The shipped MoE base ``models/tiny-moe`` is :func:`make_tiny_qwen3` with ``moe=True`` at size
``moe`` (4 layers, 8 experts of width 64, top-2; random at HF's usual init std 0.02, 1.07M
parameters): ``python -m benchmarks.tiny_model models/tiny-moe --arch qwen3_moe
--size moe --init-std 0.02``. At the 0.2 the engine tests use, the router logits are ~10x larger
and a bf16 router's rounding moves the expert weights by ~1e-2 (docs/LOG.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import (
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from megatron_rl.model.tokenizer import build_tokenizer, save_tokenizer

# Named sizes used by tests and benchmarks/rollout_engines.py.
SIZES: dict[str, dict[str, int]] = {
    "test": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, vocab_size=300),
    "3m": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, vocab_size=320),
    "20m": dict(hidden_size=512, num_hidden_layers=6, num_attention_heads=8, vocab_size=320),
    "100m": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, vocab_size=320),
    "moe": dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, vocab_size=320),
}
# Qwen3-MoE experts of the tiny sizes: count, top-k and width of one expert
MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64, norm_topk_prob=True)


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
    kwargs = _tiny_kwargs(size, tie_embeddings, init_std)
    torch.manual_seed(seed)
    return _save(Qwen2ForCausalLM(Qwen2Config(**kwargs)).eval(), out_dir)


def _tiny_kwargs(size: str, tie_embeddings: bool, init_std: float) -> dict[str, Any]:
    """The HF config keys shared by the tiny models of ``size``."""
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
    return kwargs


def make_tiny_qwen3(
    out_dir: str | Path,
    size: str = "test",
    seed: int = 0,
    moe: bool = False,
    init_std: float = 0.2,
    **overrides: Any,
) -> Path:
    """Write a random Qwen3 (QK-norm) or, with ``moe``, Qwen3-MoE to ``out_dir`` and return it.

    Grouped-query attention with half as many key/value heads as query heads; ``overrides``
    replace any HF config key (e.g. ``num_experts``, ``num_experts_per_tok``).
    """
    kwargs = _tiny_kwargs(size, tie_embeddings=False, init_std=init_std)
    kwargs["num_key_value_heads"] = max(1, kwargs["num_attention_heads"] // 2)
    if moe:
        kwargs.update(MOE)
    kwargs.update(overrides)
    torch.manual_seed(seed)
    model: PreTrainedModel
    if moe:
        model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**kwargs))
    else:
        model = Qwen3ForCausalLM(Qwen3Config(**kwargs))
    return _save(model.eval(), out_dir)


def _save(model: PreTrainedModel, out_dir: str | Path) -> Path:
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


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="write a random tiny HF model")
    parser.add_argument("out")
    parser.add_argument("--arch", choices=["qwen2", "qwen3", "qwen3_moe"], default="qwen2")
    parser.add_argument("--size", choices=sorted(SIZES), default="test")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--init-std", type=float, default=0.2)
    args = parser.parse_args(argv)
    if args.arch == "qwen2":
        out = make_tiny_qwen2(args.out, args.size, args.seed, init_std=args.init_std)
    else:
        moe = args.arch == "qwen3_moe"
        out = make_tiny_qwen3(args.out, args.size, args.seed, moe=moe, init_std=args.init_std)
    print(f"{out}: {count_parameters(out) / 1e6:.2f}M parameters")


if __name__ == "__main__":
    main()
