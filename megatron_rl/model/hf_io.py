"""Checkpoint files: HF directories (safetensors + config.json) and our Megatron directory format.

HF side: ``config.json`` (mapped to :class:`ModelConfig` by the model family,
``megatron_rl/model/arch/``, which refuses with one line what the Megatron model cannot express
exactly, instead of converting into a silently different model); weights in
``model.safetensors`` or sharded with ``model.safetensors.index.json``; tokenizer files copied
alongside.

Megatron side (what ``convert hf-to-megatron --tp N --pp M [--ep E --etp T]`` writes)::

    OUT/megatron_rl_meta.json             format version, tp, pp, ep, etp, spec, ModelConfig,
                                          HF config
    OUT/mp_rank_{tp:02d}_{pp:03d}/model.safetensors   GPTModel.state_dict() of that rank
    OUT/mp_rank_{tp:02d}_{pp:03d}_{ep:03d}/...        the same, per EP rank, when ep > 1
    OUT/tokenizer.json ...                tokenizer files of the source, so the way back keeps them

It is our own format (not Megatron's ``torch_dist``), so it does not depend on the megatron-core
version (0.16.1 cannot read 0.19 distributed checkpoints; see DESIGN.md).

Every write goes to a hidden sibling directory that is renamed into place at the end, so a reader
never sees a half-written checkpoint. Every user-facing failure is a one-line ``ValueError``
naming the file.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import safetensors.torch
from torch import Tensor

from megatron_rl.dataclass_io import from_dict, to_dict
from megatron_rl.durable import replace_dir
from megatron_rl.model.arch import hf_config_from_model_config, model_config_from_hf
from megatron_rl.model.config import ModelConfig
from megatron_rl.model.convert import SPECS, check_hf_state_dict, check_layout, shard_key

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
)
META_FILE = "megatron_rl_meta.json"
FORMAT_VERSION = 1


# ----------------------------------------------------------------------------------------------
# small file helpers


def read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ValueError(f"{path} not found")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _load_safetensors(path: Path) -> dict[str, Tensor]:
    if not path.is_file():
        raise ValueError(f"{path} not found")
    try:
        return safetensors.torch.load_file(str(path))
    except Exception as e:  # safetensors raises its own error types for corrupt files
        raise ValueError(f"{path} is not a readable safetensors file: {e}") from None


def _save_safetensors(path: Path, tensors: dict[str, Tensor]) -> None:
    """Write ``tensors``; views are fine, but two sharing one storage (the gate and up halves of
    a TP=1 ``linear_fc1``) are copied apart, because safetensors refuses shared storage."""
    owned, seen = {}, set()
    for name, t in tensors.items():
        t = t.contiguous()
        ptr = t.untyped_storage().data_ptr()
        owned[name] = t.clone() if ptr in seen else t
        seen.add(ptr)
    safetensors.torch.save_file(owned, str(path), metadata={"format": "pt"})


def _existing_dir(path: str | os.PathLike[str], what: str) -> Path:
    p = Path(path)
    if not p.is_dir():
        raise ValueError(f"{what} directory {p} does not exist")
    return p


@contextlib.contextmanager
def atomic_dir(out: str | os.PathLike[str], overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling of ``out`` to fill; it replaces ``out`` only on success, its
    files fsynced first and the old ``out`` removed only once the new one is in place
    (:func:`megatron_rl.durable.replace_dir`)."""
    final = Path(out)
    if final.exists() and not final.is_dir():
        raise ValueError(f"output {final} exists and is not a directory")
    if final.exists() and any(final.iterdir()) and not overwrite:
        raise ValueError(f"output {final} already exists and is not empty; pick a new directory")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    replace_dir(tmp, final, old=tmp.with_name(tmp.name.replace(".tmp-", ".old-")))


def copy_tokenizer_files(src: str | os.PathLike[str] | None, dst: Path) -> list[str]:
    """Copy the tokenizer (and generation config) files found in ``src`` into ``dst``."""
    if src is None:
        return []
    src_dir = _existing_dir(src, "tokenizer")
    copied = []
    for name in TOKENIZER_FILES:
        if (src_dir / name).is_file():
            shutil.copy2(src_dir / name, dst / name)
            copied.append(name)
    return copied


# ----------------------------------------------------------------------------------------------
# HF checkpoint directories


def load_hf_config(hf_dir: str | os.PathLike[str]) -> tuple[dict[str, Any], ModelConfig]:
    """The raw ``config.json`` dict and its :class:`ModelConfig` (errors name the file)."""
    d = _existing_dir(hf_dir, "HF checkpoint")
    raw = read_json(d / "config.json")
    try:
        cfg = model_config_from_hf(raw)
    except ValueError as e:
        raise ValueError(f"{d / 'config.json'}: {e}") from None
    cfg.hf_path = str(d)
    return raw, cfg


def _weight_files(d: Path) -> list[Path]:
    index = d / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index} has no 'weight_map' object")
        return [d / f for f in sorted(set(weight_map.values()))]
    if (d / "model.safetensors").is_file():
        return [d / "model.safetensors"]
    raise ValueError(
        f"{d} has no model.safetensors or model.safetensors.index.json "
        "(only safetensors weights are supported)"
    )


def load_hf(hf_dir: str | os.PathLike[str]) -> tuple[dict[str, Tensor], ModelConfig]:
    """Read an HF checkpoint: ``(state_dict, ModelConfig)``, tensors validated."""
    _, cfg = load_hf_config(hf_dir)
    return load_hf_weights(hf_dir, cfg), cfg


def load_hf_weights(hf_dir: str | os.PathLike[str], cfg: ModelConfig) -> dict[str, Tensor]:
    """The state dict of an HF checkpoint whose ``config.json`` was read already (``cfg``: its
    architecture), tensors validated against ``cfg``."""
    files = _weight_files(Path(hf_dir))
    sd: dict[str, Tensor] = {}
    for f in files:
        sd.update(_load_safetensors(f))
    where = str(files[0] if len(files) == 1 else Path(hf_dir) / "model.safetensors.index.json")
    check_hf_state_dict(sd, cfg, where)
    if cfg.tie_embeddings:
        sd.pop("lm_head.weight", None)
    return sd


def group_by_bytes(sd: dict[str, Tensor], max_shard_bytes: int) -> list[list[str]]:
    """Group tensor names, in order, into runs of at most ``max_shard_bytes`` each (a bigger
    tensor gets a run of its own): safetensors shards here, NCCL buckets in weight sync."""
    plan: list[list[str]] = [[]]
    size = 0
    for name, t in sd.items():
        nbytes = t.numel() * t.element_size()
        if plan[-1] and size + nbytes > max_shard_bytes:
            plan.append([])
            size = 0
        plan[-1].append(name)
        size += nbytes
    return plan


def _write_hf_weights(d: Path, sd: dict[str, Tensor], max_shard_bytes: int) -> None:
    plan = group_by_bytes(sd, max_shard_bytes)
    if len(plan) == 1:
        _save_safetensors(d / "model.safetensors", sd)
        return
    weight_map = {}
    for i, names in enumerate(plan):
        fname = f"model-{i + 1:05d}-of-{len(plan):05d}.safetensors"
        _save_safetensors(d / fname, {n: sd[n] for n in names})
        weight_map.update(dict.fromkeys(names, fname))
    total = sum(t.numel() * t.element_size() for t in sd.values())
    _write_json(
        d / "model.safetensors.index.json",
        {"metadata": {"total_size": total}, "weight_map": weight_map},
    )


def save_hf(
    out_dir: str | os.PathLike[str],
    state_dict: dict[str, Tensor],
    cfg: ModelConfig,
    tokenizer_from: str | os.PathLike[str] | None = None,
    hf_config: dict[str, Any] | None = None,
    overwrite: bool = False,
    max_shard_bytes: int = 5 * 2**30,
) -> Path:
    """Write an HF checkpoint directory that ``transformers``/vLLM/SGLang load directly.

    ``hf_config``: a source ``config.json`` whose extra keys (token ids, ...) are kept.
    ``tokenizer_from``: a directory whose tokenizer and generation-config files are copied.
    """
    check_hf_state_dict(state_dict, cfg, "state dict to save")
    sd = dict(state_dict)
    if cfg.tie_embeddings:
        sd.pop("lm_head.weight", None)
    config = hf_config_from_model_config(cfg, hf_config)
    with atomic_dir(out_dir, overwrite) as tmp:
        _write_hf_weights(tmp, sd, max_shard_bytes)
        _write_json(tmp / "config.json", config)
        copied = copy_tokenizer_files(tokenizer_from, tmp)
        if "generation_config.json" not in copied:
            gen = {
                k: config[k]
                for k in ("bos_token_id", "eos_token_id", "pad_token_id")
                if config.get(k) is not None
            }
            _write_json(tmp / "generation_config.json", gen)
    return Path(out_dir)


# ----------------------------------------------------------------------------------------------
# Megatron checkpoint directories (one safetensors file per rank)


def rank_file(ckpt_dir: Path, tp_rank: int, pp_rank: int, ep_rank: int | None = None) -> Path:
    """``mp_rank_{tp:02d}_{pp:03d}[_{ep:03d}]/model.safetensors`` (the EP part when ep > 1)."""
    ep = "" if ep_rank is None else f"_{ep_rank:03d}"
    return ckpt_dir / f"mp_rank_{tp_rank:02d}_{pp_rank:03d}{ep}" / "model.safetensors"


def _file_of(ckpt_dir: Path, key: tuple[int, ...]) -> Path:
    return rank_file(ckpt_dir, key[0], key[1], key[2] if len(key) == 3 else None)


def save_megatron_dir(
    out_dir: str | os.PathLike[str],
    shards: dict[tuple[int, ...], dict[str, Tensor]],
    cfg: ModelConfig,
    tp: int,
    pp: int,
    spec: str = "local",
    hf_config: dict[str, Any] | None = None,
    tokenizer_from: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
    ep: int = 1,
    etp: int = 0,
) -> Path:
    """Write ``shards`` (keyed by ``convert.shard_key``) and the metadata to ``out_dir``."""
    check_layout(cfg, tp, pp, ep, etp)
    keys = [shard_key(t, p, e, ep) for p in range(pp) for e in range(ep) for t in range(tp)]
    missing = [k for k in keys if k not in shards]
    if missing:
        raise ValueError(f"missing Megatron shard(s) (tp_rank, pp_rank[, ep_rank]): {missing}")
    meta = {
        "format_version": FORMAT_VERSION,
        "tp": tp,
        "pp": pp,
        "ep": ep,
        "etp": etp or tp,
        "spec": spec,
        "model": to_dict(cfg),
        "hf_config": hf_config,
    }
    with atomic_dir(out_dir, overwrite) as tmp:
        for key in keys:
            path = _file_of(tmp, key)
            path.parent.mkdir()
            _save_safetensors(path, shards[key])
        copy_tokenizer_files(tokenizer_from, tmp)
        _write_json(tmp / META_FILE, meta)
    return Path(out_dir)


def load_megatron_meta(ckpt_dir: str | os.PathLike[str]) -> tuple[dict[str, Any], ModelConfig]:
    """Validated ``megatron_rl_meta.json`` and its :class:`ModelConfig` (``ep``/``etp`` filled
    in for directories written before expert parallelism: 1 and ``tp``)."""
    d = _existing_dir(ckpt_dir, "Megatron checkpoint")
    path = d / META_FILE
    meta = read_json(path)
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{path}: format_version {meta.get('format_version')!r} is not "
            f"supported; expected {FORMAT_VERSION}"
        )
    try:
        cfg = from_dict(ModelConfig, meta["model"], prefix="model")
        tp, pp = int(meta["tp"]), int(meta["pp"])
        meta["ep"], meta["etp"] = int(meta.get("ep", 1)), int(meta.get("etp", tp))
        cfg.validate()
        check_layout(cfg, tp, pp, meta["ep"], meta["etp"])
    except KeyError as e:
        raise ValueError(f"{path}: missing key {e.args[0]!r}") from None
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path}: {e}") from None
    if meta.get("spec", "local") not in SPECS:
        raise ValueError(f"{path}: unknown spec {meta['spec']!r}; expected one of {SPECS}")
    return meta, cfg


def load_megatron_dir(
    ckpt_dir: str | os.PathLike[str],
) -> tuple[dict[tuple[int, ...], dict[str, Tensor]], ModelConfig, dict[str, Any]]:
    """Read a directory written by :func:`save_megatron_dir`: ``(shards, cfg, meta)``."""
    meta, cfg = load_megatron_meta(ckpt_dir)
    d = Path(ckpt_dir)
    ep = meta["ep"]
    keys = [
        shard_key(t, p, e, ep)
        for p in range(meta["pp"])
        for e in range(ep)
        for t in range(meta["tp"])
    ]
    return {k: _load_safetensors(_file_of(d, k)) for k in keys}, cfg, meta
