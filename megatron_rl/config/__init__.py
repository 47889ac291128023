"""One root config for a run: typed dataclasses, loaded from YAML plus dotted overrides.

Every component owns its dataclass in its own package (``megatron_rl/<part>/config.py``). The
loop's own sections sit beside this module instead (``train.py``: ``train``, ``sft``, ``rl`` and
``checkpoint``; ``eval.py``: ``eval``): the folders that run the loop (``train/``,
``evaluation/``, ``controller/``) take the whole :class:`RunConfig`, so a section of theirs in
their own folder would be imported by the config that imports them (docs/layout.md has the
order). This module nests the sections into :class:`RunConfig` and provides the single
loading/validation pass:

    cfg = load_config("configs/demo_cpu.yaml", ["train.lr=1e-5", "parallel.tp=2"])

Errors are ``ValueError`` with the dotted key, the bad value and what is allowed. Component
dataclasses may define ``validate(self) -> None`` for cross-field checks; it is called once,
bottom-up, after the whole tree is built. Keys that moved (:data:`RENAMED`, e.g. ``rl.eval_every``
-> ``eval.every``) still load, from a file or an override, with one warning per old key; an old
and a new key given with different values is an error. The typed dict <-> dataclass conversion
itself lives in :mod:`megatron_rl.dataclass_io` (a leaf module the model package uses too).
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import sys
from pathlib import Path
from typing import Any

import yaml

from megatron_rl.config.eval import EvalConfig
from megatron_rl.config.train import CheckpointConfig, RLConfig, SFTConfig, TrainConfig
from megatron_rl.dataclass_io import from_dict, to_dict
from megatron_rl.domains.config import DomainsConfig
from megatron_rl.durable import write_atomic
from megatron_rl.model.config import ModelConfig, ParallelConfig
from megatron_rl.rewards.config import RewardsConfig
from megatron_rl.rollout.config import RolloutConfig
from megatron_rl.scheduler.config import SchedulerConfig
from megatron_rl.slurm.config import SlurmConfig
from megatron_rl.text_checks import check_line, check_path_component
from megatron_rl.tracking.config import TrackingConfig

log = logging.getLogger(__name__)


@dataclasses.dataclass
class RunConfig:
    """The whole run. Sections map one-to-one onto the moving parts of the loop."""

    run_name: str = "run"  # name of the run; the run directory is <output_dir>/<run_name>
    output_dir: str = "runs"  # parent folder of run directories
    seed: int = 1234  # global seed (data order, sampling, init)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)  # policy architecture
    parallel: ParallelConfig = dataclasses.field(default_factory=ParallelConfig)  # TP/PP/CP/DP
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)  # optimizer and steps
    sft: SFTConfig = dataclasses.field(default_factory=SFTConfig)  # supervised fine-tuning
    rl: RLConfig = dataclasses.field(default_factory=RLConfig)  # GRPO-family loss/advantages
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)  # held-out sweeps
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)  # engines
    domains: DomainsConfig = dataclasses.field(default_factory=DomainsConfig)  # task domains
    rewards: RewardsConfig = dataclasses.field(default_factory=RewardsConfig)  # verifiers
    scheduler: SchedulerConfig = dataclasses.field(default_factory=SchedulerConfig)  # domain mix
    tracking: TrackingConfig = dataclasses.field(default_factory=TrackingConfig)  # W&B, jsonl
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    slurm: SlurmConfig = dataclasses.field(default_factory=SlurmConfig)  # sbatch layout

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.run_name

    def validate(self) -> None:
        """Checks across sections (each section validated its own fields first)."""
        # before anything is written: run_dir must stay one folder inside output_dir
        check_path_component("run_name", self.run_name, "output_dir")
        check_line("output_dir", self.output_dir)
        if self.rollout.top_p < 1:
            raise ValueError(
                f"rollout.top_p={self.rollout.top_p}: the trainer scores tokens under the full "
                "softmax, so the engine's nucleus-renormalised log-probs would not match "
                "(biased gradient and TIS weights); use rollout.top_p=1"
            )
        split = self.parallel.tp * self.parallel.pp * self.parallel.cp > 1
        if self.rl.kl_in_reward and self.rl.kl_coef > 0 and split:
            raise ValueError(
                "rl.kl_in_reward=true computes the penalty on the controller (rank 0) alone, so "
                "the reference must not be split: use parallel.tp=pp=cp=1, or KL as a loss term"
            )
        if self.scheduler.dynamic_sampling and self.rl.off_policy:
            raise ValueError(
                "scheduler.dynamic_sampling decides how many rounds to generate from the rewards "
                "of the last one, which rl.off_policy=true generates a step ahead: use "
                "rl.off_policy=false with dynamic sampling"
            )
        lag = self.rollout.sync_every - 1 + int(self.rl.off_policy)
        if lag > self.rl.max_staleness:
            raise ValueError(
                f"rl.max_staleness={self.rl.max_staleness}: with rollout.sync_every="
                f"{self.rollout.sync_every} and rl.off_policy={str(self.rl.off_policy).lower()} "
                f"samples lag the trainer by up to {lag} optimizer steps; raise "
                "rl.max_staleness or lower rollout.sync_every"
            )


def validate(obj: Any, prefix: str = "") -> None:
    """Run every nested ``validate()`` (children first)."""
    if not (dataclasses.is_dataclass(obj) and not isinstance(obj, type)):
        return
    for f in dataclasses.fields(obj):
        validate(getattr(obj, f.name), f"{prefix}.{f.name}" if prefix else f.name)
    check = getattr(obj, "validate", None)
    if callable(check):
        check()  # component messages name their full dotted key


def _parse_scalar(text: str) -> Any:
    """CLI override values are parsed as YAML scalars (1e-5, true, [a, b], null)."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    # YAML 1.1 reads "1e-5" as a string; accept it as a float.
    if isinstance(value, str):
        try:
            return float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            return value
    return value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides to a nested dict in place and return it."""
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r} must look like section.key=value")
        dotted, raw = item.split("=", 1)
        parts = dotted.strip().split(".")
        node = data
        for p in parts[:-1]:
            child = node.setdefault(p, {})
            if not isinstance(child, dict):
                raise ValueError(f"override {dotted}: {p!r} is a value, not a section")
            node = child
        node[parts[-1]] = _parse_scalar(raw)
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Load a YAML run config (optional), apply dotted overrides, build and validate it once."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ValueError(f"config file {str(p)!r} does not exist")
        try:
            loaded = yaml.safe_load(p.read_text())
        except yaml.YAMLError as e:
            raise ValueError(f"config file {str(p)!r} is not valid YAML: {e}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ValueError(f"config file {str(p)!r} must hold a mapping at the top level")
        data = loaded or {}
    apply_overrides(data, apply_renamed(data, overrides or []))
    gpu_dtype_defaults(data)
    cfg = from_dict(RunConfig, data)
    validate(cfg)
    return cfg


# Keys that moved (old dotted key -> new one): still loaded, with one warning per old key.
RENAMED = {f"rl.eval_{f.name}": f"eval.{f.name}" for f in dataclasses.fields(EvalConfig)}
RENAMED["domains.verify_workers"] = "domains.workers"  # issue 39: they run all domain code


def apply_renamed(data: dict[str, Any], overrides: list[str]) -> list[str]:
    """Move :data:`RENAMED` keys of a file's ``data`` to their new place (in place) and return
    ``overrides`` with old keys rewritten to the new ones; one warning per old key given.

    An old key and its new one given with different values in the file, or both as overrides,
    is a ``ValueError``; an override of either key replaces the file's value as usual.
    """
    given = _move_renamed(data)
    out = []
    cli: dict[str, dict[str, Any]] = {}  # new key -> {key as given: value} among the overrides
    for item in overrides:
        dotted, sep, raw = item.partition("=")
        key = dotted.strip()
        new = RENAMED.get(key, key)
        if sep and new in RENAMED.values():
            cli.setdefault(new, {})[key] = _parse_scalar(raw)
        if sep and key in RENAMED:
            given.append(key)
            item = f"{new}={raw}"
        out.append(item)
    for new, values in cli.items():
        _agree(values, new)
    for old in dict.fromkeys(given):
        log.warning("%s is deprecated; use %s", old, RENAMED[old])
    return out


def _move_renamed(data: dict[str, Any]) -> list[str]:
    """Move the old keys of a nested config dict to their new place; the old keys found."""
    found = []
    for old, new in RENAMED.items():
        (section, key), (new_section, new_key) = old.split("."), new.split(".")
        part = data.get(section)
        if not (isinstance(part, dict) and key in part):
            continue
        target = data.setdefault(new_section, {})
        if not isinstance(target, dict):
            raise ValueError(f"{new_section} must be a mapping of its keys, got {target!r}")
        value = part.pop(key)
        if new_key in target:
            _agree({old: value, new: target[new_key]}, new)
        target[new_key] = value
        found.append(old)
    return found


def _agree(values: dict[str, Any], new: str) -> None:
    """One value for ``new`` among an old key and the new one, else a ValueError naming both."""
    first, *rest = values.values()
    if any(v != first for v in rest):
        both = " and ".join(f"{k}={v!r}" for k, v in values.items())
        raise ValueError(f"{both} disagree; the old key is deprecated, give only {new}")


def gpu_dtype_defaults(data: dict[str, Any]) -> None:
    """On a CUDA machine, ``model.dtype`` and ``rollout.dtype`` default to bfloat16 (the TE
    THD attention path has no fp32 kernel; SGLang serves bf16); set them to keep fp32.
    Without an NVIDIA driver torch is not even imported (a CLI that fails on its config, or on
    an unreachable router, answers in seconds)."""
    if "torch" not in sys.modules and not glob.glob("/dev/nvidia[0-9]*"):
        return
    import torch

    if not torch.cuda.is_available():
        return
    for section in ("model", "rollout"):
        part = data.setdefault(section, {})
        if isinstance(part, dict) and "dtype" not in part:
            part["dtype"] = "bfloat16"


def save_config(cfg: RunConfig, path: str | Path) -> None:
    """Write the resolved config as YAML (every run directory and checkpoint holds one)."""
    write_atomic(path, yaml.safe_dump(to_dict(cfg), sort_keys=False))
