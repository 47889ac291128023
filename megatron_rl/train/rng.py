"""The random-number states a checkpoint keeps, as tensors, ints, floats, strings and lists only.

Checkpoints load with ``torch.load(weights_only=True)``, whose unpickler builds tensors and plain
containers and nothing else, so a checkpoint file cannot run code. ``random.getstate()`` is
already plain (a tuple of ints), but ``numpy.random.get_state()`` holds an ``ndarray``, which
that unpickler refuses: :func:`rng_state` stores each generator's state in plain form and
:func:`set_rng_state` rebuilds it.

Format (``"format": 2``; format 1, before this module, stored the generators' own objects)::

    python            {"version": int, "internal": [625 ints], "gauss": float | None}
    numpy             {"name": "MT19937", "key": [624 ints], "pos": int, "has_gauss": int,
                       "cached_gaussian": float}
    torch             ByteTensor (torch.get_rng_state())
    cuda              [ByteTensor per device]          (when CUDA is available)
    megatron_tracker  {name: ByteTensor}               (Megatron's model-parallel RNG tracker)
"""

from __future__ import annotations

import random
import sys
from typing import Any

import numpy as np
import torch

RNG_FORMAT = 2


def _megatron_initialized() -> bool:
    """Megatron's parallel state is set up (only then does its RNG tracker exist to save)."""
    mpu = sys.modules.get("megatron.core.parallel_state")
    return bool(mpu is not None and mpu.model_parallel_is_initialized())


def rng_state() -> dict[str, Any]:
    """Python, NumPy and torch RNG states (plus Megatron's tracker states when present)."""
    version, internal, gauss = random.getstate()
    name, key, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "format": RNG_FORMAT,
        "python": {"version": int(version), "internal": [int(x) for x in internal], "gauss": gauss},
        "numpy": {
            "name": str(name),
            "key": [int(x) for x in key],
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if _megatron_initialized():
        from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

        tracker = get_cuda_rng_tracker()
        if tracker.get_states():
            state["megatron_tracker"] = {k: v.clone() for k, v in tracker.get_states().items()}
    if torch.cuda.is_available():
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    return state


def _python_state(s: Any) -> tuple[Any, ...]:
    if isinstance(s, tuple):  # format 1: random.getstate() as it was
        return s
    return (int(s["version"]), tuple(int(x) for x in s["internal"]), s["gauss"])


def _numpy_state(s: Any) -> tuple[Any, ...]:
    if isinstance(s, tuple):  # format 1: numpy's own tuple, ndarray included
        return s
    key = np.asarray(s["key"], dtype=np.uint32)
    return (s["name"], key, int(s["pos"]), int(s["has_gauss"]), float(s["cached_gaussian"]))


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` saved (format 2, or a format-1 checkpoint's objects)."""
    random.setstate(_python_state(state["python"]))
    np.random.set_state(_numpy_state(state["numpy"]))
    torch.set_rng_state(state["torch"])
    if "megatron_tracker" in state:
        from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

        get_cuda_rng_tracker().set_states(state["megatron_tracker"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
