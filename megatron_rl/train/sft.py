"""Supervised fine-tuning: prompt/response pairs, loss on response tokens only, packed batches.

Data comes from the training split of the configured domains (the response is the task's gold
answer, so SFT and RL see the same prompt format) or from a JSONL file of
``{"prompt": ..., "response": ...}`` lines. The example order is a fixed permutation of the data
for the run seed, so the data position (``step * batch_size``) is all the resume state needed.

Loss: token-mean cross-entropy over all response tokens of the optimizer step, normalised once
per step (not per micro-batch), so the packing budget does not change the gradient.
"""

from __future__ import annotations

import json
import logging
import random
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from megatron_rl.config import RunConfig
from megatron_rl.domains import Domain, code_exec, load_domains
from megatron_rl.durable import write_atomic
from megatron_rl.evaluation.evaluate import evaluate
from megatron_rl.evaluation.prompt_sets import PromptSet, build_prompt_set
from megatron_rl.model.tokenizer import eos_id, load_tokenizer, prompt_ids
from megatron_rl.packing.batch import PackedBatch, budget_bins, pack
from megatron_rl.rollout.build import build_engine
from megatron_rl.train.optim import lr_at
from megatron_rl.train.preflight import preflight
from megatron_rl.train.runtime import Runtime, export_hf, save_checkpoint, setup_run

log = logging.getLogger(__name__)

Example = tuple[list[int], list[int]]  # (prompt ids, response ids incl. EOS)


def load_examples(cfg: RunConfig, tokenizer: Any) -> list[Example]:
    """All SFT pairs of the run, tokenised, in a seeded order."""
    eos = eos_id(tokenizer)
    pairs: list[tuple[str, str]] = []
    if cfg.sft.data == "domains":
        domains = load_domains(cfg.domains.include, cfg.domains.exclude, cfg.domains.task_files)
        if not domains:
            raise ValueError("sft.data=domains but domains.include selects no domain")
        for d in domains.values():
            level = cfg.domains.level if cfg.domains.level is not None else d.levels[0]
            for i in range(cfg.sft.samples_per_task):
                task = d.task("train", i, level, cfg.seed)
                pairs.append((task.prompt, task.gold))
    else:
        path = Path(cfg.sft.data)
        if not path.is_file():
            raise ValueError(f"sft.data must be 'domains' or a JSONL file; {path} does not exist")
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                row = json.loads(line)
                if "prompt" not in row or "response" not in row:
                    raise ValueError(f"{path}:{n}: each line needs 'prompt' and 'response'")
                pairs.append((row["prompt"], row["response"]))
    if cfg.sft.shuffle:
        random.Random(cfg.seed).shuffle(pairs)
    return [
        (prompt_ids(tokenizer, p), list(tokenizer.encode(r, add_special_tokens=False)) + [eos])
        for p, r in pairs
    ]


def make_microbatches(examples: list[Example], budget: int) -> list[PackedBatch]:
    """Pack one step's examples into micro-batches of at most ``budget`` tokens."""
    seqs = [p + r for p, r in examples]
    masks = [[0.0] * len(p) + [1.0] * len(r) for p, r in examples]
    bins = budget_bins([len(s) for s in seqs], budget)
    return [pack([seqs[i] for i in b], [masks[i] for i in b], seq_ids=b) for b in bins]


def sft_step(rt: Runtime, examples: list[Example], step: int) -> dict[str, float]:
    """One optimizer step of SFT; returns loss and throughput metrics."""
    batches = make_microbatches(examples, rt.cfg.train.micro_batch_tokens)
    total = sum(float(b.loss_mask.sum()) for b in batches)

    def loss_fn(
        batch: PackedBatch, logprobs: torch.Tensor, entropy: torch.Tensor | None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        nll = -(logprobs * batch.loss_mask).sum()
        return nll / total, {"nll_sum": float(nll.detach())}

    t0 = time.time()
    metrics = rt.policy.forward_backward(batches, loss_fn)
    opt = rt.policy.optimizer_step(lr_at(step, rt.cfg.train))
    dt = time.time() - t0
    tokens = sum(b.num_tokens for b in batches)
    return {
        "sft/loss": sum(m["nll_sum"] for m in metrics) / total,
        "sft/grad_norm": opt["grad_norm"],
        "sft/lr": opt["lr"],
        "perf/trained_tokens_per_s": tokens / max(dt, 1e-9),
        "perf/step_s": dt,
    }


def run_eval(
    rt: Runtime, step: int, engine: Any, domains: dict[str, Domain], prompts: PromptSet
) -> dict[str, float]:
    """Sync the policy into the engine and measure greedy accuracy on the distinct held-out
    ``prompts`` of each domain.

    Every rank calls it (the weight export is collective); only rank 0 has the engine.
    """
    cfg = rt.cfg
    sd = rt.policy.hf_state_dict()
    if engine is None:
        return {}
    engine.update_weights(sd)
    res = evaluate(
        engine,
        rt.tokenizer,
        domains,
        cfg.sft.eval_samples_per_task,
        cfg.seed,
        cfg.rollout.max_new_tokens,
        level=cfg.domains.level,
        prompts=prompts,
    )
    out = res.metrics()
    rt.tracker.log(step, out)
    return out


def _per_domain(metrics: dict[str, float], what: str) -> dict[str, float]:
    """``eval/<domain>/<what>`` -> {domain: value} (per-level keys left out)."""
    return {
        k[len("eval/") : -len(what) - 1]: v
        for k, v in metrics.items()
        if k.endswith(f"/{what}") and "/level" not in k
    }


def train_sft(cfg: RunConfig, overwrite: bool = False) -> dict[str, Any]:
    """Run (or resume) SFT; writes checkpoints, the final HF model and summary.json.
    ``overwrite``: start afresh, replacing a run already in the run directory."""
    model = preflight(cfg, "sft", overwrite)
    # the data before the start: an empty or malformed set fails with the run directory untouched
    examples = load_examples(cfg, load_tokenizer(model.hf_path))
    if not examples:
        raise ValueError("SFT data is empty")
    rt = setup_run(cfg, "sft", model, overwrite)
    bs = cfg.sft.batch_size
    log.info("SFT on %d examples, %d steps of %d", len(examples), cfg.train.steps, bs)
    engine_dir = export_hf(rt, rt.run_dir / "engine_init")
    engine = build_engine(cfg.rollout, str(engine_dir), cfg.seed) if rt.is_main else None
    eval_domains = load_domains(cfg.domains.include, cfg.domains.exclude, cfg.domains.task_files)
    code_exec.configure(cfg.rewards.allow_unsandboxed)  # the evals' code verifiers run here
    prompts = build_prompt_set(
        eval_domains, cfg.sft.eval_samples_per_task, cfg.seed, cfg.domains.level
    )
    t_start = time.time()
    bar = tqdm(
        range(rt.start_step, cfg.train.steps), disable=not (rt.is_main and cfg.tracking.progress)
    )
    for step in bar:
        pos = step * bs  # the data position: a fixed permutation, cycled
        batch = [examples[(pos + i) % len(examples)] for i in range(bs)]
        metrics = sft_step(rt, batch, step)
        rt.tracker.log(step, metrics)
        bar.set_postfix(loss=f"{metrics['sft/loss']:.3f}")
        last = step == cfg.train.steps - 1
        if cfg.sft.eval_every and (step + 1) % cfg.sft.eval_every == 0:
            run_eval(rt, step, engine, eval_domains, prompts)
        if last or (cfg.checkpoint.every and (step + 1) % cfg.checkpoint.every == 0):
            save_checkpoint(rt, step, {"data_position": (step + 1) * bs})
    final = run_eval(rt, cfg.train.steps, engine, eval_domains, prompts)
    out_dir = export_hf(rt, rt.run_dir / "hf")
    summary = {
        "eval_accuracy": _per_domain(final, "accuracy"),
        "eval_distinct": _per_domain(final, "distinct"),
        "mean_accuracy": final.get("eval/mean_accuracy"),
        "steps": cfg.train.steps,
        "wall_s": round(time.time() - t_start, 1),
        "hf_dir": str(out_dir),
    }
    if rt.is_main:
        write_atomic(rt.run_dir / "summary.json", json.dumps(summary, indent=2))
    rt.tracker.finish()
    if engine is not None:
        engine.shutdown()
    return summary
