"""``megatron-rl convert``: HF <-> Megatron checkpoint conversion (every family in
``megatron_rl/model/arch/``: Llama, Qwen2, Qwen3, Qwen3-MoE; safetensors).

    megatron-rl convert hf-to-megatron --hf DIR --out DIR [--tp N --pp N] [--ep N --etp 1|N]
                                       [--spec local|te]
    megatron-rl convert megatron-to-hf --ckpt DIR --out DIR

The Megatron side is our per-rank safetensors directory (see ``megatron_rl/model/hf_io.py``).
Impossible layouts and bad checkpoints fail before anything is written, with one line.
"""

from __future__ import annotations

import argparse
import time

from megatron_rl.model import convert, hf_io

HELP = "convert checkpoints between HF (safetensors) and Megatron TP/PP shards"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="direction", metavar="DIRECTION", required=True)
    to_meg = sub.add_parser("hf-to-megatron", help="HF directory -> Megatron shards")
    to_meg.add_argument("--hf", required=True, help="HF checkpoint directory (config.json, ...)")
    to_meg.add_argument("--out", required=True, help="output directory (must not exist)")
    to_meg.add_argument("--tp", type=int, default=1, help="tensor-parallel degree")
    to_meg.add_argument("--pp", type=int, default=1, help="pipeline-parallel degree")
    to_meg.add_argument("--ep", type=int, default=1, help="expert-parallel degree (MoE)")
    to_meg.add_argument(
        "--etp",
        type=int,
        default=0,
        help="tensor-parallel degree inside an expert: 1 or tp (0: tp)",
    )
    to_meg.add_argument(
        "--spec",
        choices=convert.SPECS,
        default="local",
        help="Megatron layer-spec naming of the norms and experts (local or te)",
    )
    to_hf = sub.add_parser("megatron-to-hf", help="Megatron shards -> HF directory")
    to_hf.add_argument("--ckpt", required=True, help="directory written by hf-to-megatron")
    to_hf.add_argument("--out", required=True, help="output HF directory (must not exist)")
    for p in (to_meg, to_hf):
        p.add_argument("--force", action="store_true", help="replace an existing --out")


def _hf_to_megatron(args: argparse.Namespace) -> str:
    raw, cfg = hf_io.load_hf_config(args.hf)
    convert.check_layout(cfg, args.tp, args.pp, args.ep, args.etp)  # fail before reading weights
    hf_sd, cfg = hf_io.load_hf(args.hf)
    shards = convert.hf_to_megatron(
        hf_sd, cfg, args.tp, args.pp, spec=args.spec, ep=args.ep, etp=args.etp
    )
    hf_io.save_megatron_dir(
        args.out,
        shards,
        cfg,
        args.tp,
        args.pp,
        spec=args.spec,
        hf_config=raw,
        tokenizer_from=args.hf,
        overwrite=args.force,
        ep=args.ep,
        etp=args.etp,
    )
    n = sum(t.numel() for t in hf_sd.values())
    layout = f"tp={args.tp} pp={args.pp}" + (f" ep={args.ep}" if args.ep > 1 else "")
    return f"{args.hf} -> {args.out}: {n / 1e6:.2f}M params, {layout}"


def _megatron_to_hf(args: argparse.Namespace) -> str:
    shards, cfg, meta = hf_io.load_megatron_dir(args.ckpt)
    hf_sd = convert.megatron_to_hf(shards, cfg, meta["tp"], meta["pp"], meta["ep"], meta["etp"])
    hf_io.save_hf(
        args.out,
        hf_sd,
        cfg,
        tokenizer_from=args.ckpt,
        hf_config=meta.get("hf_config"),
        overwrite=args.force,
    )
    n = sum(t.numel() for t in hf_sd.values())
    return f"{args.ckpt} (tp={meta['tp']} pp={meta['pp']}) -> {args.out}: {n / 1e6:.2f}M params"


def main(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    if args.direction == "hf-to-megatron":
        summary = _hf_to_megatron(args)
    else:
        summary = _megatron_to_hf(args)
    print(f"converted {summary} in {time.perf_counter() - start:.2f} s")
    return 0
