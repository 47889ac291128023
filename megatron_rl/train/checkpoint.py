"""Checkpoints that are never half-written, and resume from the newest complete one.

Layout of a run directory::

    <run_dir>/checkpoints/step_000040/       one complete checkpoint
        meta.json                            step, time, format version (written last)
        config.yaml                          the resolved run config
        hf/                                  model weights in HF layout (+ tokenizer), rank 0
        rank_00000.pt                        this rank's optimizer/RNG/trainer state
    <run_dir>/checkpoints/latest             name of the newest complete checkpoint

Every rank writes into ``step_N.tmp``; after a barrier rank 0 writes ``meta.json`` and renames the
folder to ``step_N`` (atomic on one filesystem), then rewrites ``latest`` through a temp file.
A crash at any point leaves either the previous checkpoint or the new one, never a broken one;
leftover ``*.tmp`` folders are removed at the next save.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

FORMAT_VERSION = 1
_STEP_DIR = re.compile(r"step_\d+")


def _megatron_initialized() -> bool:
    """Megatron's parallel state is set up (only then does its RNG tracker exist to save)."""
    import sys

    mpu = sys.modules.get("megatron.core.parallel_state")
    return bool(mpu is not None and mpu.model_parallel_is_initialized())


def rng_state() -> dict[str, Any]:
    """Python, NumPy and torch RNG states (plus Megatron's tracker states when present)."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if _megatron_initialized():
        from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

        tracker = get_cuda_rng_tracker()
        if tracker.get_states():
            state["megatron_tracker"] = {k: v.clone() for k, v in tracker.get_states().items()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "megatron_tracker" in state:
        from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

        get_cuda_rng_tracker().set_states(state["megatron_tracker"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _barrier() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()


def _rank() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return 0


class CheckpointManager:
    """Save/find/load checkpoints under ``<run_dir>/checkpoints``."""

    def __init__(self, run_dir: str | Path, keep: int = 2):
        self.root = Path(run_dir) / "checkpoints"
        self.keep = max(1, keep)

    def save(
        self,
        step: int,
        rank_state: dict[str, Any],
        write_rank0: Callable[[Path], None] | None = None,
    ) -> Path:
        """Write one checkpoint; ``write_rank0(tmp_dir)`` adds shared files (weights, config)."""
        rank = _rank()
        final = self.root / f"step_{step:06d}"
        tmp = self.root / f"step_{step:06d}.tmp"
        if rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            for stale in self.root.glob("*.tmp"):
                shutil.rmtree(stale, ignore_errors=True)
            tmp.mkdir(parents=True)
        _barrier()
        torch.save(rank_state, tmp / f"rank_{rank:05d}.pt")
        if rank == 0 and write_rank0 is not None:
            write_rank0(tmp)
        _barrier()
        if rank == 0:
            meta = {"step": step, "time": time.time(), "format_version": FORMAT_VERSION}
            (tmp / "meta.json").write_text(json.dumps(meta))
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
            self._write_latest(final.name)
            self._prune()
        _barrier()
        return final

    def _write_latest(self, name: str) -> None:
        tmp = self.root / "latest.tmp"
        tmp.write_text(name)
        os.replace(tmp, self.root / "latest")

    def _prune(self) -> None:
        done = self.list()
        for old in done[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)

    def list(self) -> list[Path]:
        """Complete checkpoints (those with meta.json), oldest first."""
        if not self.root.is_dir():
            return []
        # only step_NNNNNN: a .tmp folder is never complete, even with meta.json (a kill can
        # land between writing it and the rename), and a copy someone made is not ours
        found = [
            p
            for p in self.root.glob("step_*")
            if p.is_dir() and _STEP_DIR.fullmatch(p.name) and (p / "meta.json").is_file()
        ]
        return sorted(found, key=lambda p: int(p.name.split("_")[1]))

    def latest(self) -> Path | None:
        found = self.list()
        return found[-1] if found else None

    def load_rank_state(self, ckpt: Path) -> dict[str, Any]:
        path = ckpt / f"rank_{_rank():05d}.pt"
        if not path.is_file():
            raise ValueError(
                f"checkpoint {ckpt} has no state for rank {_rank()} "
                f"(was it written with a different parallel layout?)"
            )
        return torch.load(path, map_location="cpu", weights_only=False)

    @staticmethod
    def step_of(ckpt: Path) -> int:
        return int(json.loads((ckpt / "meta.json").read_text())["step"])
