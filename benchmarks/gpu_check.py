"""`make gpu-check`: the GPU paths in under 5 minutes on one GPU (written for an H100/H200).

1. **TE vs local layer spec**: one small bf16 model built twice (Transformer Engine spec, then
   megatron-core's local spec) from the same HF weights; per-token log-probs of a packed THD
   batch (4 sequences of different lengths) compared.
2. **MFU**: one timed training step set of the ~350M model of ``gpu_mfu.py``.
3. **SGLang**: one real SGLang server (``launch.servers.Fleet``, engine ``sglang``) + the trainer's
   client with ``weight_sync=distributed`` (NCCL group built as SGLang builds it): new weights
   are broadcast, then samples are generated and the server's log-probs compared with the
   trainer's (Policy.token_logprobs on the same tokens).
4. **MoE on TE** (:func:`moe_te`): a tiny bf16 Qwen3-MoE on the TE spec (alltoall dispatcher,
   TE grouped GEMM experts) against the local spec (SequentialMLP); the HF export of the TE
   model equals the weights it loaded; replaying the routes of a free forward gives the same
   log-probs; one training step (grouped-GEMM backward) has a finite grad norm. EP > 1 needs
   more than one GPU and is not part of this check.

Prints one JSON object (also ``--json OUT``) and exits non-zero when a check fails. Not run in
the session that wrote it: no GPU was lent.

    python benchmarks/gpu_check.py [--json OUT] [--skip-mfu]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

LENS = [37, 128, 5, 90]


def _policy(model_dir: Path, te: bool, train: Any = None) -> Any:
    from megatron_rl.model import gpt, hf_io, policy
    from megatron_rl.model.config import ParallelConfig
    from megatron_rl.model.parallel import init_distributed

    _, hf_cfg = hf_io.load_hf_config(str(model_dir))
    cfg = dataclasses.replace(hf_cfg, dtype="bfloat16")
    dist = init_distributed(ParallelConfig(), 0, cfg)
    real = gpt.use_te_spec
    gpt.use_te_spec = policy.use_te_spec = (lambda: True) if te else (lambda: False)  # type: ignore[attr-defined]
    try:
        pol = policy.Policy(cfg, dist, train)
    finally:
        gpt.use_te_spec = policy.use_te_spec = real  # type: ignore[attr-defined]
    sd, _ = hf_io.load_hf(str(model_dir))
    pol.load_hf_state_dict(sd)
    return pol


def _logprobs(pol: Any, seqs: list[list[int]]) -> list[torch.Tensor]:
    from long_context.packing import pack

    batch = pack(seqs, [[1.0] * len(s) for s in seqs])
    ((lp, _),) = pol.token_logprobs([batch])
    return list(torch.split(lp, [len(s) for s in seqs]))


def te_vs_local(model_dir: Path) -> dict[str, Any]:
    rng = random.Random(0)
    seqs = [[rng.randrange(300) for _ in range(n)] for n in LENS]
    te = _logprobs(_policy(model_dir, te=True), seqs)
    local = _logprobs(_policy(model_dir, te=False), seqs)
    diff = max(float((a[1:] - b[1:]).abs().max()) for a, b in zip(te, local, strict=True))
    return {"te_vs_local_logp_abs_max": diff, "te_vs_local_ok": diff < 0.05}


def mfu() -> dict[str, Any]:
    from gpu_mfu import train_mfu

    args = argparse.Namespace(steps=3, seqs=32, seq_len=1024, micro_batch_tokens=8192)
    r = train_mfu(args)
    r["mfu"] = r["achieved_flops"] / 989e12
    return {"mfu": r["mfu"], "mfu_params": r["params"], "mfu_step_s": r["step_s"]}


def sglang_update(model_dir: Path, run_dir: Path) -> dict[str, Any]:
    from launch.servers import Fleet, free_port, sglang_server_args
    from megatron_rl.rollout.base import GenRequest, SamplingParams
    from megatron_rl.rollout.config import RolloutConfig, SGLangConfig
    from megatron_rl.rollout.sglang_client import SGLangEngine

    rollout = RolloutConfig(engine="sglang", dtype="bfloat16", gpu_memory_utilization=0.3)
    args = [*sglang_server_args(rollout, 0), "--skip-tokenizer-init"]
    t0 = time.perf_counter()
    fleet_args = dict(engine="sglang", gpus_per_server=1, gpu_ids=[0], health_timeout_s=240)
    with Fleet(run_dir, str(model_dir), 1, router_port=free_port(), sglang_args=args,
               **fleet_args) as fleet:  # type: ignore[arg-type]  # fmt: skip
        start_s = time.perf_counter() - t0
        cfg = RolloutConfig(
            engine="sglang", urls=[str(fleet.router_url)], sync_mode="memory",
            sync_dir=str(run_dir / "sync"),
            sglang=SGLangConfig(weight_sync="distributed", master_port=free_port(), engine_tp=1),
        )  # fmt: skip
        engine = SGLangEngine(cfg, str(run_dir / "none"), seed=0)
        trainer = _policy(model_dir, te=True)
        with torch.no_grad():  # new weights, so the update is visible in the log-probs
            for p in trainer.module.parameters():
                p.add_(torch.randn_like(p) * 0.01)
        sd = trainer.hf_state_dict()
        t1 = time.perf_counter()
        engine.update_weights(sd)
        update_s = time.perf_counter() - t1
        reqs = [
            GenRequest([5 + i, 17, 42, 99], SamplingParams(max_tokens=16, seed=i)) for i in range(8)
        ]
        outs = engine.generate(reqs)
        seqs = [r.prompt_ids + g[0].token_ids for r, g in zip(reqs, outs, strict=True)]
        lps = _logprobs(trainer, seqs)
        worst = 0.0
        for r, g, lp in zip(reqs, outs, lps, strict=True):
            mine = lp[len(r.prompt_ids) :]
            worst = max(worst, float((mine - torch.tensor(g[0].logprobs)).abs().max()))
        engine.shutdown()
    return {"sglang_start_s": start_s, "sglang_update_s": update_s,
            "sglang_logp_abs_max": worst, "sglang_ok": worst < 0.1}  # fmt: skip


def moe_te(tmp: Path) -> dict[str, Any]:
    """Check 4 (see the module docstring): the TE MoE path on one GPU."""
    from dataclasses import replace

    from long_context.packing import pack
    from megatron_rl.model.moe import ROUTES_KEY, routes_extra
    from megatron_rl.rollout.tiny_model import make_tiny_qwen3

    model = make_tiny_qwen3(tmp / "moe", "test", seed=0, moe=True)
    rng = random.Random(1)
    seqs = [[rng.randrange(300) for _ in range(n)] for n in LENS]
    local = _logprobs(_policy(model, te=False), seqs)
    pol = _policy(model, te=True)
    te = _logprobs(pol, seqs)
    diff = max(float((a[1:] - b[1:]).abs().max()) for a, b in zip(te, local, strict=True))
    from megatron_rl.model import hf_io

    sd, _ = hf_io.load_hf(str(model))
    back = pol.hf_state_dict()
    export_exact = back.keys() == sd.keys() and all(
        torch.equal(back[k].cpu(), sd[k].to(back[k].dtype)) for k in sd
    )
    batch = pack(seqs, [[1.0] * len(q) for q in seqs])
    pol.replay.record()
    ((free, _),) = pol.token_logprobs([batch])
    routes = pol.replay.recorded().cpu()
    pol.replay.record(False)
    replayed_batch = replace(batch, extras={ROUTES_KEY: routes_extra(routes)})
    ((replayed, _),) = pol.token_logprobs([replayed_batch])
    replay_diff = float((free - replayed).abs().max())
    from megatron_rl.train.config import TrainConfig

    trainer = _policy(model, te=True, train=TrainConfig(lr=1e-4))
    trainer.forward_backward([batch], lambda b, lp, ent: (-(lp * b.loss_mask).mean(), {}))
    grad_norm = trainer.optimizer_step(1e-4)["grad_norm"]
    ok = diff < 0.05 and export_exact and replay_diff == 0.0 and math.isfinite(grad_norm)
    return {"moe_te_vs_local_logp_abs_max": diff, "moe_te_export_exact": export_exact,
            "moe_te_replay_logp_abs_max": replay_diff, "moe_te_grad_norm": grad_norm,
            "moe_te_ok": ok}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None, help="write the figures here too")
    p.add_argument("--skip-mfu", action="store_true", help="only the correctness checks")
    a = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_check.py needs a CUDA GPU")
    from megatron_rl.model.parallel import have_transformer_engine
    from megatron_rl.rollout.tiny_model import make_tiny_qwen2

    if not have_transformer_engine():
        raise SystemExit(
            "gpu_check.py: transformer_engine does not import; run launch/setup_env.sh"
        )
    tmp = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    model = make_tiny_qwen2(tmp / "model", "3m", seed=0)
    out: dict[str, Any] = {"gpu": torch.cuda.get_device_name()}
    out.update(te_vs_local(model))
    if not a.skip_mfu:
        out.update(mfu())
    out.update(sglang_update(model, tmp / "run"))
    out.update(moe_te(tmp))
    print(json.dumps(out, indent=2))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2))
    if not (out["te_vs_local_ok"] and out["sglang_ok"] and out["moe_te_ok"]):
        raise SystemExit("gpu-check: a check failed (see above)")


if __name__ == "__main__":
    main()
