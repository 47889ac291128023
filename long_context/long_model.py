"""Long-position variants of a checkpoint: RoPE base and max positions raised, weights unchanged.

A model trained at ``old_max`` positions meets positions far beyond them in long-context RL. The
variant keeps every weight and raises ``max_position_embeddings`` and the RoPE base with the
NTK-aware rule (base' = base * s ** (d / (d - 2)), s = new_max / old_max, d = head size): the
lowest RoPE frequency then spans the new length as it spanned the old one, while the highest
frequencies (local order) barely move. The converter (``megatron_rl/model/hf_io.py``) reads and
writes both fields, so Megatron, the rollout engines and exported checkpoints all agree.

``models/tiny-base-long`` is ``make_long_variant("models/tiny-base", ..., 32768)``: its
``config.json`` is written here and its weights and tokenizer are links to ``models/tiny-base``.

    python -m long_context.long_model models/tiny-base models/tiny-base-long --max-positions 32768
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace
from pathlib import Path

from megatron_rl.model import hf_io
from megatron_rl.model.config import ModelConfig

LINKED = (
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "generation_config.json",
)


def ntk_rope_base(base: float, head_dim: int, old_max: int, new_max: int) -> float:
    """NTK-aware RoPE base for stretching ``old_max`` positions to ``new_max``."""
    if new_max <= old_max:
        return base
    scale = new_max / old_max
    return float(round(base * scale ** (head_dim / (head_dim - 2))))


def long_variant(cfg: ModelConfig, max_positions: int) -> ModelConfig:
    """``cfg`` with max positions raised to ``max_positions`` and the NTK-aware RoPE base."""
    if max_positions < cfg.max_position_embeddings:
        raise ValueError(
            f"--max-positions={max_positions} must be >= the model's "
            f"max_position_embeddings={cfg.max_position_embeddings}"
        )
    base = ntk_rope_base(cfg.rotary_base, cfg.head_dim, cfg.max_position_embeddings, max_positions)
    return replace(cfg, max_position_embeddings=max_positions, rotary_base=base)


def make_long_variant(
    src: str | os.PathLike[str], dst: str | os.PathLike[str], max_positions: int
) -> ModelConfig:
    """Write ``dst``: the config of ``src`` with :func:`long_variant`, other files linked."""
    src_dir, dst_dir = Path(src), Path(dst)
    source, cfg = hf_io.load_hf_config(src_dir)
    long_cfg = replace(long_variant(cfg, max_positions), hf_path=str(dst_dir))
    dst_dir.mkdir(parents=True, exist_ok=True)
    config = hf_io.hf_config_from_model_config(long_cfg, source)
    (dst_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    for name in LINKED:
        if (src_dir / name).exists() and not (dst_dir / name).exists():
            (dst_dir / name).symlink_to(os.path.relpath(src_dir / name, dst_dir))
    return long_cfg


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src")
    parser.add_argument("dst")
    parser.add_argument("--max-positions", type=int, default=32768)
    args = parser.parse_args()
    cfg = make_long_variant(args.src, args.dst, args.max_positions)
    print(
        f"{args.dst}: max_position_embeddings={cfg.max_position_embeddings} "
        f"rope_theta={cfg.rotary_base:g}"
    )


if __name__ == "__main__":
    main()
