"""The shared ``main`` of the layout-comparison workers (run under torchrun).

Each worker defines ``LAYOUTS`` (name -> arguments of its ``run_layout``) and ``run_layout``;
this runs the layouts named by ``--layouts`` one after the other in the same processes (the
process group stays up between them) and saves rank 0's result of each as ``<name>.pt``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from megatron_rl.model.parallel import destroy_distributed


def run_layouts(
    layouts: dict[str, tuple[int, ...]],
    run_layout: Callable[..., dict[str, Any]],
    default: str,
) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--layouts", default=default)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for name in args.layouts.split(","):
        result = run_layout(*layouts[name])
        if dist.get_rank() == 0:
            torch.save(result, Path(args.out_dir) / f"{name}.pt")
        destroy_distributed(keep_process_group=True)
    destroy_distributed()
