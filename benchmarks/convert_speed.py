"""How fast the HF <-> Megatron converter is on a ~100M-parameter random Qwen2.

    .venv/bin/python -m benchmarks.convert_speed [--layers 12 --hidden 768 --vocab 16384]

Times (median of --repeats runs, one thread, fp32):

* ``hf_to_megatron`` at TP=1 and TP=2 (all ranks), and ``megatron_to_hf`` back from each, with
  every output tensor made contiguous (what writing or sending it needs). Baseline beside it: one
  ``clone()`` of every tensor of the HF state dict, i.e. a single pass over the model's memory.
* ``save_hf`` / ``load_hf`` (safetensors + config + validation) and the per-rank Megatron
  directory at TP=2. Baseline: ``safetensors.torch.save_file`` / ``load_file`` of the same state
  dict into the same temp folder. Loads include reading one value per page, because safetensors
  maps the file lazily (without it a "load" takes milliseconds and reads nothing).

Each line prints seconds and the ratio to its baseline, so numbers from machines of different
speed can be compared; the header gives the core count and the parameter count.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from megatron_rl.model import convert, hf_io
from megatron_rl.model.config import ModelConfig


def qwen2_config(layers: int, hidden: int, vocab: int) -> ModelConfig:
    """Qwen2-shaped config: head size 64, 4 query groups, ffn = 8/3 hidden rounded to 256."""
    heads = hidden // 64
    ffn = (8 * hidden // 3 + 255) // 256 * 256
    return ModelConfig(arch="qwen2", num_layers=layers, hidden_size=hidden, ffn_hidden_size=ffn,
                       num_attention_heads=heads, num_query_groups=4, vocab_size=vocab,
                       qkv_bias=True, tie_embeddings=False)  # fmt: skip


def random_hf_state_dict(cfg: ModelConfig) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {
        n: torch.randn(s, generator=gen) * 0.02 for n, s in convert.hf_param_shapes(cfg).items()
    }


def timed(fn: Callable[[], Any], repeats: int) -> float:
    """Median wall seconds of ``repeats`` calls."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def materialise(obj: Any) -> None:
    """Force every tensor (nested in dicts) to be contiguous, as a writer or sender would."""
    for v in obj.values():
        if isinstance(v, dict):
            materialise(v)
        else:
            v.contiguous()


def _to_megatron(sd: dict[str, torch.Tensor], cfg: ModelConfig, tp: int) -> None:
    materialise(convert.hf_to_megatron(sd, cfg, tp=tp))


def _to_hf(
    shards: dict[tuple[int, int], dict[str, torch.Tensor]], cfg: ModelConfig, tp: int
) -> None:
    materialise(convert.megatron_to_hf(shards, cfg, tp=tp))


def touch(*sds: dict[str, torch.Tensor]) -> None:
    """Read one value per 4 KiB page: safetensors maps files lazily, so a load is only done
    once the data has been read."""
    for sd in sds:
        for t in sd.values():
            float(t.reshape(-1)[::1024].sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--vocab", type=int, default=16384)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = qwen2_config(args.layers, args.hidden, args.vocab)
    sd = random_hf_state_dict(cfg)
    params = sum(t.numel() for t in sd.values())
    print(f"cores={os.cpu_count()} threads=1 params={params / 1e6:.1f}M dtype=float32 "
          f"({params * 4 / 2**20:.0f} MiB) repeats={args.repeats} (median)")  # fmt: skip
    rows: list[tuple[str, float, float]] = []
    r = args.repeats

    clone_s = timed(lambda: {k: v.clone() for k, v in sd.items()}, r)
    for tp in (1, 2):
        shards = convert.hf_to_megatron(sd, cfg, tp=tp)
        to_meg = timed(partial(_to_megatron, sd, cfg, tp), r)
        to_hf = timed(partial(_to_hf, shards, cfg, tp), r)
        rows += [(f"hf_to_megatron tp={tp}", to_meg, clone_s),
                 (f"megatron_to_hf tp={tp}", to_hf, clone_s)]  # fmt: skip

    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
        raw = Path(tmp) / "raw.safetensors"
        base_save = timed(lambda: safetensors.torch.save_file(sd, str(raw)), r)
        base_load = timed(lambda: touch(safetensors.torch.load_file(str(raw))), r)
        hf_dir, meg_dir = Path(tmp) / "hf", Path(tmp) / "meg"
        shards = convert.hf_to_megatron(sd, cfg, tp=2)
        save = timed(lambda: hf_io.save_hf(hf_dir, sd, cfg, overwrite=True), r)
        load = timed(lambda: touch(hf_io.load_hf(hf_dir)[0]), r)
        msave = timed(
            lambda: hf_io.save_megatron_dir(meg_dir, shards, cfg, 2, 1, overwrite=True), r
        )
        mload = timed(lambda: touch(*hf_io.load_megatron_dir(meg_dir)[0].values()), r)
    rows += [("save_hf (safetensors)", save, base_save), ("load_hf (safetensors)", load, base_load),
             ("save_megatron_dir tp=2", msave, base_save),
             ("load_megatron_dir tp=2", mload, base_load)]  # fmt: skip

    print(f"baselines: clone all tensors {clone_s:.3f} s, safetensors save_file {base_save:.3f} s,"
          f" load_file {base_load:.3f} s")  # fmt: skip
    print(f"{'step':<26}{'seconds':>10}{'x baseline':>12}")
    for name, secs, base in rows:
        print(f"{name:<26}{secs:>10.3f}{secs / base:>12.2f}")


if __name__ == "__main__":
    main()
