"""The config loader: YAML + dotted overrides, one validation pass, clear errors."""

from __future__ import annotations

import pytest

from megatron_rl.config import RunConfig, apply_overrides, load_config, save_config, to_dict


def test_defaults_validate() -> None:
    cfg = load_config(None, [])
    assert isinstance(cfg, RunConfig)
    assert cfg.model.head_dim == cfg.model.hidden_size // cfg.model.num_attention_heads


def test_yaml_and_overrides(tmp_path) -> None:
    p = tmp_path / "run.yaml"
    p.write_text("run_name: x\ntrain:\n  lr: 0.01\nrl:\n  group_size: 4\n")
    cfg = load_config(p, ["train.lr=1e-5", "rl.advantage=drgrpo", "domains.include=[a, 'b/*']"])
    assert cfg.run_name == "x"
    assert cfg.train.lr == pytest.approx(1e-5)
    assert cfg.rl.group_size == 4
    assert cfg.rl.advantage == "drgrpo"
    assert cfg.domains.include == ["a", "b/*"]


def test_resolved_config_round_trips(tmp_path) -> None:
    cfg = load_config(None, ["seed=3", "rl.dual_clip=3.0"])
    save_config(cfg, tmp_path / "c.yaml")
    again = load_config(tmp_path / "c.yaml", [])
    assert to_dict(again) == to_dict(cfg)


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("train.lrr=1", "unknown config key train.'lrr'"),
        ("nosuch.x=1", "unknown config key 'nosuch'"),
        ("rl.advantage=ppo", "rl.advantage='ppo' is not allowed"),
        ("train.steps=abc", "train.steps must be an integer"),
        ("model.hidden_size=130", "divisible by model.num_attention_heads"),
        ("rl.dual_clip=0.5", "rl.dual_clip must be > 1"),
        ("train.lr=0", "train.lr must be > 0"),
        ("train.lr", "must look like section.key=value"),
    ],
)
def test_bad_values_name_the_key(override: str, needle: str) -> None:
    with pytest.raises(ValueError) as e:
        load_config(None, [override])
    assert needle in str(e.value)


def test_missing_or_malformed_file(tmp_path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1, 2\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_config(bad)


def test_override_into_value_is_rejected() -> None:
    with pytest.raises(ValueError, match="is a value, not a section"):
        apply_overrides({"seed": 1}, ["seed.x=2"])


def test_shipped_configs_load() -> None:
    for name in ("configs/base_sft.yaml", "configs/demo_cpu.yaml"):
        load_config(name, [])
