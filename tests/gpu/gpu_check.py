"""`make gpu-check`: the GPU paths that one lent GPU can check, in under 5 minutes, no set-up.

Written for the machine this workplace lends: one H200, Python 3.12, torch (CUDA) and
transformers, but no megatron-core, Transformer Engine, SGLang or vLLM, and no network. What it
lacks comes from wheels that ``make gpu-wheels`` downloads on a networked machine into
``gpu_wheels/`` (megatron-core, aiohttp, jsonschema and their deps: ~6 MiB, carried along):
they are unpacked into a temporary folder and put on ``sys.path``, nothing is installed.

Checks (a registry in ``gpu_checks.py``: add one with ``@check(name, needs=..., gpus=...)``);
each runs only when
what it needs imports and enough GPUs are there, else prints one line naming what is missing:

* ``device``: the GPU, its capability and a bf16 matmul against fp32;
* ``hf_engine``: the ``hf`` rollout engine on the GPU: sampled tokens' log-probs vs a plain
  transformers forward of the same weights;
* ``weight_update``: the embedded SGLang-API server on the GPU + the production ``sglang``
  client: weights pushed from disk (``update_weights_from_disk``) and as tensors
  (``update_weights``: safetensors + reload), then the server's log-probs vs the new weights;
* ``megatron_policy``: the Megatron GPT policy (local spec: no Transformer Engine) on the GPU:
  token log-probs of a packed batch of 4 sequences vs transformers;
* ``mfu``: training-step MFU of the ~350M model of ``gpu_mfu.py`` (local spec), 3 steps;
* ``te_vs_local``: per-token log-probs of a packed batch, TE layer spec vs local spec (needs TE);
* ``moe_te``: a tiny Qwen3-MoE on the TE spec (alltoall, grouped GEMM) vs local, exact export,
  routing replay, one training step (needs TE; EP > 1 needs more GPUs);
* ``sglang_update``: needs SGLang (not written yet);
* ``nccl_weight_group``: the NCCL weight-update group needs 2 GPUs (NCCL refuses two ranks on
  one device), so on one GPU it is listed as unrun.

Prints one JSON object (also ``--json OUT``); exits 1 when a check that ran failed.
``--device cpu`` runs the same checks on CPU (how they were tried before any GPU was lent).

    python tests/gpu/gpu_check.py [--json OUT] [--only a,b] [--device cpu]

A script run by its path (the lent machine may have no pytest); it puts the repository on
``sys.path`` itself. Its checks are in ``gpu_checks.py`` beside it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import tempfile
import time
import traceback
import zipfile
from pathlib import Path
from typing import Any

from gpu_checks import CHECKS, Check, Ctx  # beside this script (its folder is on sys.path)

ROOT = Path(__file__).resolve().parents[2]
WHEELS = Path(os.environ.get("GPU_CHECK_WHEELS", str(ROOT / "gpu_wheels")))  # make gpu-wheels
sys.path.insert(0, str(ROOT))


def use_wheels(folder: Path) -> list[str]:
    """Unpack the wheels in ``folder`` for this Python and machine onto ``sys.path``."""
    if not folder.is_dir():
        return []
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    arch = platform.machine()
    target = Path(tempfile.mkdtemp(prefix="gpu-check-wheels-"))
    used = []
    for whl in sorted(folder.glob("*.whl")):
        py, abi, plat = whl.name[: -len(".whl")].split("-")[-3:]
        if (py.startswith("cp") and abi != "abi3" and py != tag) or (
            plat != "any" and arch not in plat
        ):
            continue  # another Python or machine
        with zipfile.ZipFile(whl) as z:
            tops = {n.split("/")[0].removesuffix(".py") for n in z.namelist()}
            tops = {t for t in tops if not t.endswith((".dist-info", ".data", ".libs"))}
            if tops and all(importlib.util.find_spec(t) for t in tops):
                continue  # the machine has it: keep its own
            z.extractall(target)
        used.append(whl.name)
    sys.path.insert(0, str(target))
    return used


def missing(c: Check, ctx_gpus: int, device: str) -> str | None:
    """Why ``c`` cannot run here (None: it can)."""
    for mod in c.needs:
        try:
            if importlib.util.find_spec(mod) is None:
                return f"{mod} is not installed"
        except ModuleNotFoundError:
            return f"{mod} is not installed"
    if device == "cuda" and ctx_gpus < c.gpus:
        return f"needs {c.gpus} GPUs, this machine has {ctx_gpus}"
    if device == "cpu" and c.gpus:
        return "needs a GPU"
    return None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None, help="write the figures here too")
    p.add_argument("--only", default="", help="comma-separated check names")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    a = p.parse_args()
    wheels = use_wheels(WHEELS)
    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check.py: no CUDA GPU visible (use --device cpu to try the checks on CPU)")
        return 1
    ctx = Ctx(a.device)
    out: dict[str, Any] = {"device": a.device, "wheels": wheels, "checks": {}, "unrun": {}}
    names = [n for n in a.only.split(",") if n] or list(CHECKS)
    for name in names:
        c = CHECKS[name]
        why = missing(c, ctx.gpus, a.device)
        if why:
            out["unrun"][name] = why
            print(f"gpu-check: {name}: not run: {why}", flush=True)
            continue
        t0 = time.perf_counter()
        try:
            res = c.fn(ctx)
        except Exception as e:
            res = {"ok": False, "error": f"{type(e).__name__}: {e}",
                   "trace": traceback.format_exc()[-2000:]}  # fmt: skip
        res["seconds"] = round(time.perf_counter() - t0, 2)
        out["checks"][name] = res
        print(f"gpu-check: {name}: {'ok' if res['ok'] else 'FAILED'} ({res['seconds']} s)",
              flush=True)  # fmt: skip
    print(json.dumps(out, indent=2, default=str))
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(out, indent=2, default=str))
    return 0 if all(r["ok"] for r in out["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
