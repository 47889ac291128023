"""Start-up validation: everything a run needs is checked before anything is written.

:func:`preflight` is the first call of :func:`megatron_rl.train.runtime.setup_run`; only after it
returns is the run directory created or touched, ``config.yaml`` saved, a log opened or the W&B
run resumed. A failed start therefore leaves an existing run directory byte-identical (a
re-run of a finished run with a typo must not overwrite its resolved config or logs).

Checked, each failing with one ``ValueError`` that names the key and what is allowed:

* the config itself (types, ranges, Slurm settings: :func:`megatron_rl.config.validate`);
* the run directory: one that holds a run is resumed (``checkpoint.resume=true``) or replaced
  on request (``megatron-rl train --overwrite``), never overwritten because
  ``checkpoint.resume=false`` (:func:`check_run_dir`);
* the model: ``model.hf_path`` is a folder with a readable ``config.json``, safetensors weights
  and a tokenizer whose vocabulary fits the model's;
* the layout: ``parallel.*`` against the world size (``WORLD_SIZE``) and the model's heads,
  query groups and layers (:func:`megatron_rl.model.parallel.validate_layout`), and for RL that
  every data-parallel rank can get a group; the one layout check of a run;
* the domains: every ``domains.include`` / ``exclude`` pattern matches, the selection is not
  empty (RL; SFT on domains), each offers ``domains.level`` (no task is drawn here: plugins'
  generators run in the RL fit check, under a deadline), and the scheduler accepts them;
  SFT's ``sft.data`` file exists;
* the rollout engine: registered, its package importable, and for ``sglang`` a configured URL
  that something answers at (rank 0 only, the one process that talks to servers): an
  unreachable router fails here within 5 s (``REACH_WINDOW_S``), in one line;
* routing replay (``rl.routing_replay=rollout``): an MoE model, no recomputation, an engine
  that returns routed experts here (hf anywhere, vLLM on GPU, SGLang).

Nothing here writes, starts a process group or loads weights (only ``config.json`` and the
tokenizer are read), so it costs well under a second on the demo. :func:`preflight` returns the
model the run builds (``config.json``'s architecture with the run's training options), so
start-up reads ``config.json`` once and hands that on.
"""

from __future__ import annotations

import importlib.util
import os
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

from megatron_rl.config import RunConfig, validate
from megatron_rl.model.config import ModelConfig, ParallelConfig

REACH_WINDOW_S = 5.0  # how long start-up tries to reach rollout.urls[0] before failing
# Engines whose Python package must import for them to start (engine name -> module).
_ENGINE_PACKAGES = {"vllm": "vllm"}


def preflight(cfg: RunConfig, kind: str, overwrite: bool = False) -> ModelConfig:
    """Raise ``ValueError`` on the first thing that would make a ``kind`` run ('rl' or 'sft')
    fail to start; write nothing. Returns the model the run builds (:func:`check_model`). See
    the module docstring for what is checked; ``overwrite``: the run replaces the one in its
    directory (``--overwrite``)."""
    if kind not in ("rl", "sft"):
        raise ValueError(f"run kind must be 'rl' or 'sft', got {kind!r}")
    validate(cfg)  # a config built in code (not by load_config) is checked too
    check_run_dir(cfg, overwrite)
    model = check_model(cfg)
    check_layout(cfg, model, kind)
    if kind == "rl":
        check_routing_replay(cfg, model)
    if kind == "rl" or cfg.sft.data == "domains":
        check_domains(cfg, scheduler=kind == "rl")
    elif not Path(cfg.sft.data).is_file():
        raise ValueError(f"sft.data must be 'domains' or a JSONL file; {cfg.sft.data} is neither")
    check_engine(cfg, model)
    return model


RUN_MARKERS = ("config.yaml", "metrics.jsonl", "events.jsonl", "summary.json")  # a run was here


def check_run_dir(cfg: RunConfig, overwrite: bool) -> None:
    """A run directory that holds a run (its config, logs, summary or a checkpoint) is not
    started afresh over with ``checkpoint.resume=false`` unless ``overwrite`` says so."""
    if cfg.checkpoint.resume or overwrite:
        return
    run = cfg.run_dir
    found = [n for n in RUN_MARKERS if (run / n).exists()]
    if (run / "checkpoints").is_dir() and any((run / "checkpoints").iterdir()):
        found.append("checkpoints/")
    if found:
        raise ValueError(
            f"run directory {run} already holds a run ({', '.join(found)}); "
            f"checkpoint.resume=false would overwrite it. Resume it with checkpoint.resume=true, "
            f"or replace it with --overwrite (or choose another run_name / output_dir)"
        )


def check_model(cfg: RunConfig) -> ModelConfig:
    """The model the run will build: ``model.*``, or with ``model.hf_path`` the architecture of
    the checkpoint's ``config.json`` with the run's dtype, recompute and the experts' aux /
    z-loss weights and dispatcher."""
    if not cfg.model.hf_path:
        return cfg.model
    from megatron_rl.model import hf_io

    path = Path(cfg.model.hf_path)
    if not path.is_dir():
        raise ValueError(f"model.hf_path={cfg.model.hf_path!r} is not a folder (no config.json)")
    _, hf_model = hf_io.load_hf_config(path)
    mine = cfg.model.moe  # the run's training options for the experts (the shape is HF's)
    moe = replace(
        hf_model.moe,
        aux_loss_coeff=mine.aux_loss_coeff,
        z_loss_coeff=mine.z_loss_coeff,
        dispatcher=mine.dispatcher,
    )
    model = replace(
        hf_model,
        hf_path=cfg.model.hf_path,
        dtype=cfg.model.dtype,
        recompute=cfg.model.recompute,
        moe=moe,
    )
    if not any(path.glob("*.safetensors")):
        raise ValueError(f"model.hf_path={str(path)!r} holds no *.safetensors weights")
    tokenizer = _load_tokenizer(path)
    if len(tokenizer) > model.vocab_size:
        raise ValueError(
            f"model.hf_path={str(path)!r}: the tokenizer has {len(tokenizer)} tokens, more "
            f"than the model's vocab_size={model.vocab_size}"
        )
    return model


def _load_tokenizer(path: Path) -> Any:
    from megatron_rl.model.tokenizer import load_tokenizer

    try:
        return load_tokenizer(path)
    except (OSError, ValueError, TypeError) as e:
        raise ValueError(f"model.hf_path={str(path)!r}: cannot load its tokenizer: {e}") from None


def check_layout(cfg: RunConfig, model: ModelConfig, kind: str = "sft") -> None:
    """``parallel.*`` against the world size this process was started in, and the model; for
    an RL run also the data-parallel share (:func:`check_rl_layout`)."""
    from megatron_rl.model.parallel import validate_layout

    raw = os.environ.get("WORLD_SIZE", "1")
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"WORLD_SIZE={raw!r} must be a positive integer (set by torchrun)")
    if kind == "rl":
        check_rl_layout(cfg.parallel, cfg.rl.prompts_per_step, int(raw), model)
    else:
        validate_layout(cfg.parallel, int(raw), model)


def check_rl_layout(
    parallel: ParallelConfig,
    prompts_per_step: int,
    world_size: int,
    model: ModelConfig | None = None,
) -> None:
    """The layout fits (:func:`validate_layout`) and every DP rank can get a group."""
    from megatron_rl.model.parallel import validate_layout

    validate_layout(parallel, world_size, model)
    dp = world_size // (parallel.tp * parallel.pp * parallel.cp)
    if prompts_per_step < dp:
        raise ValueError(
            f"rl.prompts_per_step={prompts_per_step} is below the data-parallel size "
            f"{dp} (world {world_size} / (parallel.tp * parallel.pp * parallel.cp)); "
            f"use rl.prompts_per_step >= {dp} so every DP rank can get a group"
        )


def check_routing_replay(cfg: RunConfig, model: ModelConfig) -> None:
    """``rl.routing_replay=rollout`` needs an MoE model, an engine that returns the experts it
    chose, and no activation recomputation (a recomputed forward would route freely)."""
    if cfg.rl.routing_replay == "off":
        return
    if not model.is_moe:
        raise ValueError(
            "rl.routing_replay=rollout needs a mixture-of-experts model; "
            f"model.arch={model.arch} is dense: use rl.routing_replay=off"
        )
    if cfg.model.recompute != "none":
        raise ValueError(
            f"rl.routing_replay=rollout with model.recompute={cfg.model.recompute} is "
            "not supported (the recomputed forward would route freely); use "
            "model.recompute=none"
        )
    import torch

    if cfg.rollout.engine == "vllm" and not torch.cuda.is_available():
        raise ValueError(
            "rl.routing_replay=rollout with rollout.engine=vllm needs a GPU: vLLM "
            "returns routed experts only from its V2 model runner, which needs "
            "Triton; use rollout.engine=hf on CPU"
        )


def check_domains(cfg: RunConfig, scheduler: bool) -> None:
    """Every domain pattern matches, the selection is not empty, the scheduler accepts it."""
    from megatron_rl.domains import load_domains

    d = cfg.domains
    domains = load_domains(d.include, d.exclude, d.task_files)
    if not domains:
        raise ValueError(
            "domains.include selects no domain; list them with `megatron-rl domains list`"
        )
    for dom in domains.values():  # the level the run asks for exists (no draw: a plugin's
        # generator runs only in the domain workers, under a deadline; controller/admission.py)
        if d.level is not None and d.level not in dom.levels:
            raise ValueError(
                f"domains: {dom.name}: level={d.level} is not a level of {dom.name}; "
                f"allowed: {dom.levels} (domains.level={d.level})"
            )
    if scheduler:
        from megatron_rl.scheduler import DomainInfo, DomainScheduler

        infos = [DomainInfo(x.name, x.tier, list(x.levels), list(x.tags)) for x in domains.values()]
        DomainScheduler(cfg.scheduler, infos, cfg.seed)


def check_engine(cfg: RunConfig, model: ModelConfig | None = None) -> None:
    """The rollout engine is registered and can be started from this environment."""
    from megatron_rl.rollout.base import ENGINES, load_builtin_engines

    load_builtin_engines()
    name = cfg.rollout.engine
    if name not in ENGINES:
        raise ValueError(
            f"rollout.engine={name!r} is not a registered engine; choose one of {sorted(ENGINES)}"
        )
    package = _ENGINE_PACKAGES.get(name)
    if package and importlib.util.find_spec(package) is None:
        raise ValueError(f"rollout.engine={name!r} needs the {package!r} package, not installed")
    if name == "vllm" and model is not None and model.is_moe:
        import torch

        if not torch.cuda.is_available():
            from megatron_rl.rollout.vllm_engine import MOE_RELOAD_ON_CPU

            raise ValueError(
                MOE_RELOAD_ON_CPU.replace("rollout engine 'vllm'", "rollout.engine=vllm")
            )
    if name == "sglang" and not cfg.rollout.urls:
        raise ValueError("rollout.engine=sglang needs rollout.urls=[http://ROUTER:PORT]")
    check_rollout_reachable(cfg)


def check_rollout_reachable(cfg: RunConfig) -> None:
    """For ``rollout.engine=sglang``, on rank 0: :func:`check_reachable` on ``rollout.urls[0]``.
    Cheap to import and run, so ``megatron-rl train`` calls it before loading torch."""
    if cfg.rollout.engine == "sglang" and cfg.rollout.urls and os.environ.get("RANK", "0") == "0":
        check_reachable(
            cfg.rollout.urls[0], min(REACH_WINDOW_S, cfg.rollout.sglang.connect_timeout_s)
        )


def check_reachable(url: str, within_s: float) -> None:
    """Something answers HTTP at ``url`` (any status: a router still waiting for its servers
    is reachable) within ``within_s`` seconds; otherwise one ``ValueError`` naming the key."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=min(3.0, within_s)):
                return
        except urllib.error.HTTPError:
            return  # it answered
        except (urllib.error.URLError, OSError, ValueError) as e:
            why = getattr(e, "reason", e)
        refused = isinstance(why, ConnectionRefusedError)  # nothing listens: no need to wait
        if time.monotonic() >= (deadline - within_s / 2 if refused else deadline):
            raise ValueError(
                f"rollout.urls[0]={url} is unreachable ({why}); start "
                "the router and servers first, or fix rollout.urls"
            )
        time.sleep(0.5)
