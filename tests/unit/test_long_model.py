"""The long-position variant of the tiny policy (long_context/long_model.py, issue 17).

``models/tiny-base-long`` must be exactly what the helper writes (RoPE base raised by the
NTK-aware rule for 512 -> 32768 positions, weights and tokenizer those of ``models/tiny-base``),
and the converter must carry both fields: HF config -> ``ModelConfig`` -> Megatron's RoPE, and
back out into an exported ``config.json``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from long_context.long_model import long_variant, make_long_variant, ntk_rope_base
from megatron_rl.model import hf_io

ROOT = Path(__file__).resolve().parents[2]
BASE, LONG = ROOT / "models" / "tiny-base", ROOT / "models" / "tiny-base-long"


def test_ntk_rope_base_by_hand() -> None:
    # base * s ** (d / (d - 2)) with s = 64, d = 64: 10000 * 64 ** (64 / 62)
    assert ntk_rope_base(10000.0, 64, 512, 32768) == round(10000 * 64 ** (64 / 62))
    assert ntk_rope_base(10000.0, 64, 512, 512) == 10000.0
    with pytest.raises(ValueError, match="--max-positions=256 must be >="):
        long_variant(hf_io.load_hf_config(BASE)[1], 256)


def test_shipped_variant_is_what_the_helper_writes(tmp_path: Path) -> None:
    written = make_long_variant(BASE, tmp_path / "long", 32768)
    assert (tmp_path / "long" / "config.json").read_text() == (LONG / "config.json").read_text()
    _, shipped = hf_io.load_hf_config(LONG)
    assert replace(shipped, hf_path=None) == replace(written, hf_path=None)
    assert shipped.max_position_embeddings == 32768
    assert shipped.rotary_base == ntk_rope_base(10000.0, 64, 512, 32768) == 731887.0
    base_sd, _ = hf_io.load_hf(BASE)
    long_sd, _ = hf_io.load_hf(LONG)
    assert base_sd.keys() == long_sd.keys()
    assert all(torch.equal(base_sd[k], long_sd[k]) for k in base_sd)


def test_converter_carries_rope_base_and_positions(tmp_path: Path, dist1: object) -> None:
    from megatron_rl.model.gpt import build_gpt_model

    sd, cfg = hf_io.load_hf(LONG)
    model = build_gpt_model(cfg, True, True)
    inv_freq = model.rotary_pos_emb.inv_freq
    expected = 1.0 / (731887.0 ** (torch.arange(0, 64, 2, dtype=torch.float32) / 64))
    assert torch.allclose(inv_freq.float().cpu(), expected, rtol=1e-5)
    hf_io.save_hf(tmp_path / "out", sd, cfg, tokenizer_from=LONG)
    saved = hf_io.read_json(tmp_path / "out" / "config.json")
    assert saved["max_position_embeddings"] == 32768
    assert saved["rope_theta"] == saved["rope_parameters"]["rope_theta"] == 731887.0
