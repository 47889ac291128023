"""Long-context RL steps at CP=2 vs CP=1 on CPU: memory per rank and step time (issue 17).

For each length (default 8192 and 16384 tokens) and CP size, one ``torchrun`` launch of ``cp``
CPU processes (gloo, one torch thread each) builds the policy of ``configs/long_context_cpu.yaml``
(the long-position tiny model, ``models/tiny-base-long``), packs one RL sample of exactly that
many tokens (a needle-retrieval prompt of the long-context curriculum, tokenized by the model's
tokenizer, then a 32-token response with advantages and engine log-probs), and runs
``rl_step.train_step`` on it: one warm-up step on a short sample, then ``--steps`` timed steps.

Per rank it records the peak resident set size (``ru_maxrss``) and the growth of the peak over
the RSS before the timed steps (what the long step itself needs). Both CP sizes use the same core
attention (``long_context/cp_attention.py``, chunked SDPA under a causal mask from global
positions; at CP=1 it is swapped into the policy in place of the local spec's dense masked
attention, which at 16k tokens would need tens of GiB for its [heads, T, T] scores), so the
ratios measure the context split, not a kernel change.

    .venv/bin/python -m benchmarks.long_context_cp [--lengths 8192 16384] [--steps 2] --json OUT
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import ROOT

CONFIG = ROOT / "configs" / "long_context_cpu.yaml"
MODEL = "models/tiny-base-long"  # the long-position tiny model (the run's warm start's shape)
RESPONSE = 32  # response tokens of the sample (the trained part)


def rl_sample(tokenizer: Any, length: int, seed: int) -> Any:
    """One packed RL sample of exactly ``length`` tokens: needle prompt + response."""
    import torch

    from long_context.tasks import LEVEL_TOKENS, generate
    from megatron_rl.packing.batch import pack

    level = next(i for i, n in enumerate(LEVEL_TOKENS) if 4 * n >= length)  # byte tokenizer
    ids = tokenizer.encode(generate("needle", seed, level).prompt)
    prompt = (ids * (length // max(len(ids), 1) + 1))[: length - RESPONSE]
    g = torch.Generator().manual_seed(seed)
    response = torch.randint(1, 256, (RESPONSE,), generator=g).tolist()
    mask = [0.0] * len(prompt) + [1.0] * RESPONSE
    adv = [0.0] * len(prompt) + [1.0 if seed % 2 else -1.0] * RESPONSE
    rlp = [0.0] * len(prompt) + [-3.0] * RESPONSE
    return pack([prompt + response], [mask], extras={"adv": [adv], "rollout_lp": [rlp]})


def use_cp_attention(policy: Any) -> None:
    """CP=1 with the CP core attention (the kernel CP=2 uses), fed the same THD layout."""
    from megatron_rl.model.cp.attention import CPDotProductAttention

    for layer in policy.module.decoder.layers:
        old = layer.self_attention.core_attention
        layer.self_attention.core_attention = CPDotProductAttention(
            old.config, layer.layer_number, old.attn_mask_type, "self"
        )
    policy.cp_layout = True


def worker(args: argparse.Namespace) -> None:
    """Inside torchrun: build, warm up, time ``args.steps`` steps; rank 0 writes ``args.out``."""
    import torch
    import torch.distributed as dist

    from megatron_rl.config import load_config
    from megatron_rl.model import hf_io
    from megatron_rl.model.parallel import init_distributed
    from megatron_rl.model.policy import Policy
    from megatron_rl.model.tokenizer import load_tokenizer
    from megatron_rl.train.step import train_step

    torch.set_num_threads(1)
    # the long-position model itself (weights do not change step cost); every micro-batch split
    cfg = load_config(
        CONFIG,
        [f"parallel.cp={args.cp}", f"model.hf_path={MODEL}", "parallel.cp_min_tokens=0"],
    )
    sd, model_cfg = hf_io.load_hf(cfg.model.hf_path or "")
    info = init_distributed(cfg.parallel, cfg.seed)
    policy = Policy(model_cfg, info, cfg.train)
    policy.load_hf_state_dict(sd)
    if args.cp == 1 and args.kernel == "cp":
        use_cp_attention(policy)
    tokenizer = load_tokenizer(cfg.model.hf_path)
    train_step(policy, cfg, [rl_sample(tokenizer, 512, seed=0)], 0)  # warm-up
    before = rss_mib()
    times, cpu = [], []
    for step in range(args.steps):
        batch = rl_sample(tokenizer, args.length, seed=step + 1)
        dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        train_step(policy, cfg, [batch], step + 1)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    mine = {"rss_before_mib": before, "peak_rss_mib": peak_rss_mib(), "step_s": times,
            "cpu_s": cpu}  # fmt: skip
    ranks: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, mine)
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps({"cp": args.cp, "ranks": ranks}))
    dist.destroy_process_group()


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def launch(cp: int, length: int, steps: int, tmp: Path, kernel: str = "cp") -> dict[str, Any]:
    """One torchrun launch of ``cp`` processes; returns rank 0's JSON with every rank's numbers."""
    out = tmp / f"cp{cp}_{kernel}_{length}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", str(cp), "-m", "benchmarks.long_context_cp", "--worker",
           "--cp", str(cp), "--length", str(length), "--steps", str(steps), "--out", str(out),
           "--kernel", kernel]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    return dict(json.loads(out.read_text()))


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    ranks = run["ranks"]
    return {
        "step_s": min(min(r["step_s"]) for r in ranks),  # best step (the machine is shared)
        "cpu_s_per_rank": [round(min(r["cpu_s"]), 3) for r in ranks],  # this process's CPU
        "peak_rss_mib_per_rank": [round(r["peak_rss_mib"], 1) for r in ranks],
        "step_mem_mib_per_rank": [round(r["peak_rss_mib"] - r["rss_before_mib"], 1) for r in ranks],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 16384])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--threads", type=int, default=1, help="(run_all compatibility; 1 used)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cp", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, default=8192, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--kernel", default="cp", choices=["cp", "varlen"], help=argparse.SUPPRESS)
    parser.add_argument(
        "--switch",
        action="store_true",
        help="measure the CP switch point instead: CP=1 with the whole-row varlen kernel (what a "
        "micro-batch below parallel.cp_min_tokens runs) against CP=2 split, per length",
    )
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if args.switch:
        switch_point(args.lengths, args.steps, args.json)
        return
    result: dict[str, Any] = {"per_length": {}, "load_avg_1m": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as tmp:
        for length in args.lengths:
            cp1 = summarize(launch(1, length, args.steps, Path(tmp)))
            cp2 = summarize(launch(2, length, args.steps, Path(tmp)))
            result["per_length"][str(length)] = {
                "cp1": cp1,
                "cp2": cp2,
                "step_time_ratio": cp2["step_s"] / cp1["step_s"],
                "step_mem_ratio": max(cp2["step_mem_mib_per_rank"])
                / max(cp1["step_mem_mib_per_rank"]),
                "peak_rss_ratio": max(cp2["peak_rss_mib_per_rank"])
                / max(cp1["peak_rss_mib_per_rank"]),
            }
            print(json.dumps({str(length): result["per_length"][str(length)]}), flush=True)
    longest = result["per_length"][str(max(args.lengths))]
    result["cp2_vs_cp1"] = {
        "tokens": max(args.lengths),
        **{k: longest[k] for k in ("step_time_ratio", "step_mem_ratio", "peak_rss_ratio")},
    }
    print(json.dumps(result["cp2_vs_cp1"]))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


def switch_point(lengths: list[int], steps: int, out: str | None) -> None:
    """Per length: one RL step of one sequence, whole on one process (varlen kernel) vs split
    over two (CP=2). With two processes, running whole sequences side by side (the CP group as
    data parallelism) trains 2 / t1 sequences per second, splitting them 1 / t2; the memory a
    whole sequence needs in one process is the other side of the choice."""
    result: dict[str, Any] = {"per_length": {}, "load_avg_1m_start": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as tmp:
        for length in lengths:
            whole = summarize(launch(1, length, steps, Path(tmp), kernel="varlen"))
            split = summarize(launch(2, length, steps, Path(tmp)))
            row = {
                "whole_1proc": whole,
                "split_cp2": split,
                "seq_per_cpu_s_whole": 1.0 / whole["cpu_s_per_rank"][0],
                "seq_per_cpu_s_split": 1.0 / sum(split["cpu_s_per_rank"]),
                "step_mem_ratio": max(split["step_mem_mib_per_rank"])
                / max(whole["step_mem_mib_per_rank"]),
                "load_avg_1m": os.getloadavg()[0],
            }
            result["per_length"][str(length)] = row
            print(json.dumps({str(length): row}), flush=True)
    if out:
        Path(out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
