"""Trainer -> rollout engine weight sync, in HF layout, in memory or through local disk.

The trainer converts its Megatron weights to HF names once (``megatron_rl.model.convert``) and
hands the dict here. Two modes:

- ``memory``: the engine copies the tensors directly (engine in this process).
- ``disk``: the tensors are written to ``<dir>/model.safetensors`` and the engine reloads that
  file. The file is written to a temporary name in the same folder and renamed into place, so a
  reader (or a crash) never sees a half-written file. This is the CPU path of DESIGN.md and the
  fallback for engines in other processes.

Returned metrics (namespaced for the tracker): ``sync/seconds`` (wall time of the whole sync),
``sync/engine_seconds`` (what the engine reported for loading), ``sync/write_seconds`` (disk
mode only, else 0) and ``sync/bytes`` (size of the weights synced).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from safetensors.torch import save_file

if TYPE_CHECKING:
    from torch import Tensor

    from megatron_rl.rollout.base import RolloutEngine

SyncMode = Literal["memory", "disk"]
WEIGHTS_FILE = "model.safetensors"


def state_dict_bytes(hf_state_dict: dict[str, Tensor]) -> int:
    """Total size of the tensors in bytes."""
    return sum(t.numel() * t.element_size() for t in hf_state_dict.values())


def write_safetensors(hf_state_dict: dict[str, Tensor], out_dir: str | Path) -> Path:
    """Write ``<out_dir>/model.safetensors`` atomically (temp file + rename); return its path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # safetensors refuses shared or non-contiguous storage (tied embeddings share it): copy
    # only the tensors whose storage was already seen.
    tensors: dict[str, Tensor] = {}
    seen: set[int] = set()
    for name, t in hf_state_dict.items():
        t = t.detach().cpu().contiguous()
        if t.untyped_storage().data_ptr() in seen:
            t = t.clone()
        seen.add(t.untyped_storage().data_ptr())
        tensors[name] = t
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".safetensors", dir=out)
    os.close(fd)
    try:
        save_file(tensors, tmp)
        os.replace(tmp, out / WEIGHTS_FILE)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out / WEIGHTS_FILE


def sync_weights(
    engine: RolloutEngine,
    hf_state_dict: dict[str, Tensor],
    mode: SyncMode = "memory",
    dir: str | Path | None = None,
) -> dict[str, float]:
    """Push ``hf_state_dict`` (HF names -> tensors) to ``engine``; return timing metrics."""
    start = time.perf_counter()
    write_s = 0.0
    if mode == "memory":
        engine_s = engine.update_weights(hf_state_dict)
    elif mode == "disk":
        if dir is None:
            raise ValueError("sync_weights(mode='disk') needs dir= (where to write the weights)")
        write_start = time.perf_counter()
        write_safetensors(hf_state_dict, dir)
        write_s = time.perf_counter() - write_start
        engine_s = engine.update_weights_from_disk(str(dir))
    else:
        raise ValueError(f"weight sync mode {mode!r} is not known; choose 'memory' or 'disk'")
    return {
        "sync/seconds": time.perf_counter() - start,
        "sync/engine_seconds": float(engine_s),
        "sync/write_seconds": write_s,
        "sync/bytes": float(state_dict_bytes(hf_state_dict)),
    }
