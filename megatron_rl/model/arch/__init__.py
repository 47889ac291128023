"""Model families, one module per architecture, and the registry that picks one.

``FAMILIES`` maps ``ModelConfig.arch`` to its family (:class:`~.base.DenseFamily` or a
subclass): ``llama_qwen2.py`` (Llama, Qwen2), ``qwen3.py`` (Qwen3 dense: QK-norm),
``qwen3_moe.py`` (Qwen3-MoE) and ``qwen2_moe.py`` (Qwen2-MoE: a gated shared expert); their MoE
MLP is ``moe.py``'s. A family owns the ``config.json`` mapping, the layer-spec options and one
layer's HF <-> Megatron tensors; ``convert.py``, ``hf_io.py`` and ``gpt.py`` ask it instead of
branching on architecture names.
"""

from __future__ import annotations

from typing import Any

from megatron_rl.model.arch.base import DenseFamily
from megatron_rl.model.arch.llama_qwen2 import Llama, Qwen2
from megatron_rl.model.arch.qwen2_moe import Qwen2Moe
from megatron_rl.model.arch.qwen3 import Qwen3
from megatron_rl.model.arch.qwen3_moe import Qwen3Moe
from megatron_rl.model.config import ModelConfig

FAMILIES: dict[str, DenseFamily] = {
    f.arch: f for f in (Qwen2(), Llama(), Qwen3(), Qwen3Moe(), Qwen2Moe())
}
BY_HF_CLASS: dict[str, DenseFamily] = {f.hf_class: f for f in FAMILIES.values()}


def family(cfg: ModelConfig) -> DenseFamily:
    """The family of ``cfg.arch`` (a config that passed validation always has one)."""
    if cfg.arch not in FAMILIES:
        raise ValueError(
            f"model.arch={cfg.arch!r} is not supported; choose one of {sorted(FAMILIES)}"
        )
    return FAMILIES[cfg.arch]


def hf_family(config: dict[str, Any]) -> DenseFamily:
    """The family of an HF ``config.json`` dict (``architectures[0]``, else ``model_type``)."""
    archs = config.get("architectures") or []
    name = archs[0] if archs else None
    if name is None:
        by_type = {f.model_type: f.hf_class for f in FAMILIES.values()}
        name = by_type.get(config.get("model_type", ""), config.get("model_type"))
    if name not in BY_HF_CLASS:
        raise ValueError(f"unsupported architecture {name!r}; supported: {sorted(BY_HF_CLASS)}")
    return BY_HF_CLASS[name]


def model_config_from_hf(config: dict[str, Any]) -> ModelConfig:
    """:class:`ModelConfig` of an HF ``config.json`` dict."""
    fam = hf_family(config)
    try:
        fam.refuse(config)
        cfg = ModelConfig(**fam.config_fields(config))
    except KeyError as e:
        raise ValueError(f"config.json has no {e.args[0]!r} (needed for {fam.arch})") from None
    cfg.validate()
    return cfg


def hf_config_from_model_config(
    cfg: ModelConfig, base: dict[str, Any] | None = None
) -> dict[str, Any]:
    """HF ``config.json`` dict for ``cfg``; keys of ``base`` we do not set (token ids...) kept."""
    fam = family(cfg)
    fam.check_writable(cfg)
    out = dict(base or {})
    for key in fam.drop_hf_keys():
        out.pop(key, None)
    out.update(fam.hf_fields(cfg))
    return out
