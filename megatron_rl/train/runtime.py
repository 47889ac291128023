"""What SFT and RL runs share: run directory, distributed init, policy, resume, export.

``setup_run`` is the single start-up path: validate (once: config, model, layout, domains, engine,
and that the run directory may be written: ``train/preflight.py``), initialise torch.distributed +
Megatron, build the tokenizer and the policy (from an HF checkpoint or random), resume from the
newest complete checkpoint when there is one, and only then, the start having succeeded, write to
the run directory: create it, clear the old run on ``--overwrite``, trim the logs to the
checkpoint (``Tracker``) and save the resolved config. A start that fails anywhere before that
(a bad checkpoint, a model that does not load) leaves the run directory byte-identical.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from megatron_rl.config import RunConfig, save_config, to_dict
from megatron_rl.model import hf_io
from megatron_rl.model.config import ModelConfig
from megatron_rl.model.parallel import init_distributed
from megatron_rl.model.policy import Policy
from megatron_rl.model.tokenizer import load_tokenizer
from megatron_rl.run import Run
from megatron_rl.tracking.tracker import Tracker
from megatron_rl.train.checkpoint import CheckpointManager, rng_state, set_rng_state
from megatron_rl.train.preflight import preflight

# what a run writes in its directory, removed when ``--overwrite`` starts it afresh (the
# launcher's files, job.sbatch, logs/ and servers-*.json, stay); plus every top-level *.jsonl
RUN_OUTPUTS = ("checkpoints", "summary.json", "prescreen.json", "wandb_id.txt")

log = logging.getLogger(__name__)


@dataclass
class Runtime(Run):
    """The run (what the controller and evaluation see) plus the trainer's policy and its
    checkpoints."""

    policy: Policy
    ckpt: CheckpointManager


def setup_run(
    cfg: RunConfig, kind: str, model: ModelConfig | None = None, overwrite: bool = False
) -> Runtime:
    """Start (or resume) a run of ``kind`` ('sft' or 'rl'); ``model``: what :func:`preflight`
    returned, where the caller ran it (it is run here otherwise). ``overwrite``: start afresh
    even where the run directory holds a run, replacing it (``megatron-rl train --overwrite``)."""
    # everything checked before anything is written; with model.hf_path, the architecture comes
    # from the checkpoint's config.json, read there once (train/preflight.py)
    cfg = replace(cfg, model=model if model is not None else preflight(cfg, kind, overwrite))
    if cfg.train.threads > 0:
        torch.set_num_threads(cfg.train.threads)
    dist = init_distributed(cfg.parallel, cfg.seed)
    run_dir = cfg.run_dir
    tokenizer = load_tokenizer(cfg.model.hf_path)
    policy = Policy(cfg.model, dist, cfg.train, cp_min_tokens=cfg.parallel.cp_min_tokens)
    ckpt = CheckpointManager(
        run_dir, keep=cfg.checkpoint.keep, allow_legacy=cfg.checkpoint.allow_legacy
    )
    latest = ckpt.latest() if cfg.checkpoint.resume and not overwrite else None
    start_step, state = 0, dict[str, Any]()
    if latest is not None:
        start_step, state = _resume(policy, ckpt, latest)
        log.info("resuming %s run from %s (next step %d)", kind, latest, start_step)
    elif cfg.model.hf_path:
        policy.load_hf_state_dict(hf_io.load_hf_weights(cfg.model.hf_path, cfg.model))
        log.info("initialised policy from %s", cfg.model.hf_path)
    # the start has succeeded: only now is the run directory written
    if dist.rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        if overwrite:
            _clear_run(run_dir)
    tracker = Tracker(
        cfg.tracking,
        run_dir,
        to_dict(cfg),
        resume_step=start_step - 1 if latest is not None else None,
        enabled=dist.rank == 0,
    )
    if dist.rank == 0:
        save_config(cfg, run_dir / "config.yaml")
    return Runtime(
        cfg=cfg,
        dist=dist,
        tokenizer=tokenizer,
        tracker=tracker,
        start_step=start_step,
        resumed_state=state,
        policy=policy,
        ckpt=ckpt,
    )


def _clear_run(run_dir: Path) -> None:
    """Remove the previous run's outputs (``RUN_OUTPUTS`` and its logs) for a fresh start."""
    for p in [*(run_dir / n for n in RUN_OUTPUTS), *run_dir.glob("*.jsonl")]:
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
    log.warning("--overwrite: removed the previous run's checkpoints and logs in %s", run_dir)


def _resume(policy: Policy, ckpt: CheckpointManager, path: Path) -> tuple[int, dict[str, Any]]:
    rank_state = ckpt.load_rank_state(path)
    policy.load_model_state_shard(rank_state["model"])
    policy.load_optimizer_state(rank_state["optimizer"])
    set_rng_state(rank_state["rng"])
    return CheckpointManager.step_of(path) + 1, rank_state.get("trainer", {})


def save_checkpoint(
    rt: Runtime,
    step: int,
    trainer_state: dict[str, Any],
    hf_sd: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Checkpoint after optimizer step ``step``: model, optimizer, RNG, trainer state, config.

    ``hf_sd``: the policy's current HF state dict if the caller already gathered it (e.g. for
    this step's weight sync), so it is not gathered across ranks a second time.
    """
    rank_state = {
        "model": rt.policy.model_state_shard(),
        "optimizer": rt.policy.optimizer_state(),
        "rng": rng_state(),
        "trainer": trainer_state,
    }
    if hf_sd is None:
        hf_sd = rt.policy.hf_state_dict()

    def write_rank0(tmp: Path) -> None:
        save_config(rt.cfg, tmp / "config.yaml")
        export_hf(rt, tmp / "hf", hf_sd)

    return rt.ckpt.save(step, rank_state, write_rank0)


def export_hf(
    rt: Runtime, out_dir: str | Path, hf_sd: dict[str, torch.Tensor] | None = None
) -> Path:
    """Write the policy in HF layout (safetensors + config.json + tokenizer) to ``out_dir``."""
    sd = hf_sd if hf_sd is not None else rt.policy.hf_state_dict()
    out = Path(out_dir)
    if rt.is_main:
        hf_io.save_hf(out, sd, rt.cfg.model, tokenizer_from=rt.cfg.model.hf_path, overwrite=True)
        if not rt.cfg.model.hf_path:
            rt.tokenizer.save_pretrained(str(out))
    return out
