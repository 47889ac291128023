"""Checkpoints that are never half-written, and resume from the newest complete one.

Layout of a run directory::

    <run_dir>/checkpoints/step_000040/       one complete checkpoint
        meta.json                            step, time, format version (written last)
        config.yaml                          the resolved run config
        hf/                                  model weights in HF layout (+ tokenizer), rank 0
        rank_00000.pt                        this rank's optimizer/RNG/trainer state
    <run_dir>/checkpoints/latest             name of the newest complete checkpoint

Every rank writes into ``step_N.tmp`` and fsyncs its file; after a barrier rank 0 writes
``meta.json``, fsyncs every file and folder of ``step_N.tmp``, renames it to ``step_N`` (atomic
on one filesystem) and fsyncs ``checkpoints/``, then rewrites ``latest`` (temp file, fsync,
rename, fsync), and only then removes the checkpoints past ``keep``. A kill or a node crash at any
point leaves the previous checkpoint or the new one, complete on disk, never a broken one
(``megatron_rl/durable.py``). A step saved again (its folder exists) is swapped in: the old
folder is renamed aside to ``step_N.old`` and removed only after the new one is in place; a
kill between the two renames leaves ``step_N.old``, which counts as the checkpoint and is put
back at the next save. Leftover ``*.tmp`` / ``*.del`` folders are removed at the next save.

Files load with ``torch.load(weights_only=True)``: a rank file holds tensors and plain data only
(the RNG states too: ``train/rng.py``), so a copied run directory cannot run code. A checkpoint
of format 1 (meta.json's ``format_version``; written before that change) holds numpy arrays in
its RNG state: it is refused with a ValueError saying so, and resumes with
``checkpoint.allow_legacy=true``, which allow-lists numpy's array-rebuilding globals (and nothing
else) for that load. (The format is read first, because importing megatron-core allow-lists
numpy's arrays process-wide, so whether torch alone refuses such a file depends on the process.)
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import pickle
import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from megatron_rl.durable import OLD_SUFFIX, fsync_dir, fsync_file, replace_dir, write_atomic
from megatron_rl.train.rng import rng_state, set_rng_state

__all__ = ["FORMAT_VERSION", "CheckpointManager", "rng_state", "set_rng_state"]

FORMAT_VERSION = 2  # 2: RNG states in plain form (train/rng.py); 1: the generators' objects
_STEP_DIR = re.compile(r"step_\d+")
_STALE = (".tmp", ".del")  # a save cut before its rename; a pruned folder not yet removed


@contextlib.contextmanager
def _legacy_globals() -> Iterator[None]:
    """Allow-list what a format-1 rank file needs beyond plain data: numpy's ndarray rebuild
    (its RNG state's key array, under numpy 2's name and numpy 1's), and nothing else."""
    multiarray = importlib.import_module(
        "numpy._core.multiarray" if hasattr(np, "_core") else "numpy.core.multiarray"
    )
    rebuild = multiarray._reconstruct
    dtypes = {type(np.dtype(t)) for t in (np.uint32, np.int64, np.float64)}
    allowed: list[Any] = [rebuild, (rebuild, "numpy.core.multiarray._reconstruct")]
    allowed += [np.ndarray, np.dtype, *dtypes]
    with torch.serialization.safe_globals(allowed):
        yield


def _refusal(e: Exception) -> str:
    """What torch's weights-only unpickler refused, without its advice to load unsafely."""
    parts = [p.strip() for p in str(e).split("\n\n")]
    keep = [p.removeprefix("WeightsUnpickler error:").strip() for p in parts]
    keep = [p for p in keep if p and "weights_only" not in p and "documentation" not in p]
    return " ".join(keep)[:300] or "unreadable"


def _barrier() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()


def _rank() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return 0


class CheckpointManager:
    """Save/find/load checkpoints under ``<run_dir>/checkpoints``."""

    def __init__(self, run_dir: str | Path, keep: int = 2, allow_legacy: bool = False):
        self.root = Path(run_dir) / "checkpoints"
        self.keep = max(1, keep)
        self.allow_legacy = allow_legacy  # format-1 files: numpy's globals allow-listed

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
            self._clean()
            tmp.mkdir(parents=True)
        _barrier()
        mine = tmp / f"rank_{rank:05d}.pt"
        torch.save(rank_state, mine)
        fsync_file(mine)
        if rank == 0 and write_rank0 is not None:
            write_rank0(tmp)
        _barrier()
        if rank == 0:
            meta = {"step": step, "time": time.time(), "format_version": FORMAT_VERSION}
            (tmp / "meta.json").write_text(json.dumps(meta))
            replace_dir(tmp, final)  # every file fsynced, then renamed, then the folder fsynced
            write_atomic(self.root / "latest", final.name)
            self._prune()
        _barrier()
        return final

    def _clean(self) -> None:
        """Remove what cut saves and prunes left, and put back a ``step_N.old`` whose swap was
        cut before the new ``step_N`` landed (it is that step's one complete copy)."""
        for p in sorted(self.root.iterdir()):
            if p.name.endswith(_STALE) and p.is_dir():
                shutil.rmtree(p)
            elif p.name.endswith(_STALE):  # a temp file of write_atomic (or latest.tmp)
                p.unlink()
            elif p.name.endswith(OLD_SUFFIX) and _STEP_DIR.fullmatch(p.name[: -len(OLD_SUFFIX)]):
                final = p.with_name(p.name[: -len(OLD_SUFFIX)])
                if self._complete(final):
                    shutil.rmtree(p)
                    continue
                if final.exists():  # without meta.json it is no checkpoint; the .old one is
                    shutil.rmtree(final)
                os.replace(p, final)
                fsync_dir(self.root)

    def _prune(self) -> None:
        """Drop the checkpoints past ``keep`` (renamed to ``*.del`` first, so a kill during the
        removal never leaves a partly removed folder that still looks complete)."""
        for old in self.list()[: -self.keep]:
            gone = old.with_name(old.name.removesuffix(OLD_SUFFIX) + ".del")
            old.rename(gone)
            shutil.rmtree(gone, ignore_errors=True)

    @staticmethod
    def _complete(path: Path) -> bool:
        return path.is_dir() and (path / "meta.json").is_file()

    def list(self) -> list[Path]:
        """Complete checkpoints (those with meta.json), oldest first."""
        if not self.root.is_dir():
            return []
        # only step_NNNNNN: a .tmp folder is never complete, even with meta.json (a kill can
        # land between writing it and the rename), and a copy someone made is not ours; a
        # step_NNNNNN.old stands in for its step while a swap of that step was cut
        names = {
            p.name.removesuffix(OLD_SUFFIX)
            for p in self.root.glob("step_*")
            if _STEP_DIR.fullmatch(p.name.removesuffix(OLD_SUFFIX))
        }
        found = []
        for name in names:
            final, old = self.root / name, self.root / (name + OLD_SUFFIX)
            if self._complete(final):
                found.append(final)
            elif self._complete(old):  # a swap of this step, cut between its two renames
                found.append(old)
        return sorted(found, key=lambda p: int(p.name.removesuffix(OLD_SUFFIX).split("_")[1]))

    def latest(self) -> Path | None:
        found = self.list()
        return found[-1] if found else None

    def load_rank_state(self, ckpt: Path) -> dict[str, Any]:
        """This rank's state of ``ckpt``, loaded as tensors and plain data only."""
        path = ckpt / f"rank_{_rank():05d}.pt"
        if not path.is_file():
            raise ValueError(
                f"checkpoint {ckpt} has no state for rank {_rank()} "
                f"(was it written with a different parallel layout?)"
            )
        version = self.format_of(ckpt)
        if version < FORMAT_VERSION and not self.allow_legacy:
            raise ValueError(
                f"checkpoint {ckpt} is of format {version}, from before checkpoints held plain "
                f"data only: its RNG state holds numpy arrays. If you trust this run directory, "
                f"resume it once with checkpoint.allow_legacy=true (numpy's array globals are "
                f"then allow-listed for the weights-only load, nothing else); the checkpoints it "
                f"writes are of format {FORMAT_VERSION}"
            )
        try:
            with _legacy_globals() if version < FORMAT_VERSION else contextlib.nullcontext():
                return dict(torch.load(path, map_location="cpu", weights_only=True))
        except pickle.UnpicklingError as e:
            raise ValueError(
                f"{path} does not load as tensors and plain data: it is damaged, or holds other "
                f"objects (not written by this code, or altered); refusing to unpickle it "
                f"({_refusal(e)})"
            ) from None
        except (RuntimeError, EOFError, OSError) as e:
            what = f"{type(e).__name__}: {e}".rstrip(": ")
            raise ValueError(f"{path} is not a readable checkpoint file ({what})") from None

    @staticmethod
    def format_of(ckpt: Path) -> int:
        """The format of ``ckpt`` (meta.json's ``format_version``; 1 where it has none)."""
        try:
            return int(json.loads((ckpt / "meta.json").read_text()).get("format_version", 1))
        except (ValueError, AttributeError) as e:
            raise ValueError(f"{ckpt / 'meta.json'} is not a checkpoint's meta: {e}") from None

    @staticmethod
    def step_of(ckpt: Path) -> int:
        return int(json.loads((ckpt / "meta.json").read_text())["step"])
