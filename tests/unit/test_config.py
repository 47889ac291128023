"""The config loader: YAML + dotted overrides, one validation pass, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from megatron_rl.config import RunConfig, apply_overrides, load_config, save_config, to_dict

ROOT = Path(__file__).resolve().parents[1]


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


def test_shipped_configs_use_no_renamed_key(caplog) -> None:
    for path in [*ROOT.glob("configs/*.yaml"), *ROOT.glob("benchmarks/configs/*.yaml")]:
        load_config(path, [])
    assert not _deprecations(caplog)


def _deprecations(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]


def test_an_old_eval_key_in_a_file_loads_with_one_warning(tmp_path, caplog) -> None:
    """A config of before the eval section (a run's saved config.yaml too) still loads."""
    p = tmp_path / "old.yaml"
    p.write_text("rl:\n  group_size: 4\n  eval_every: 7\n  eval_levels: [1, 2]\n")
    cfg = load_config(p, [])
    assert (cfg.eval.every, cfg.eval.levels, cfg.rl.group_size) == (7, [1, 2], 4)
    assert _deprecations(caplog) == [
        "rl.eval_every is deprecated; use eval.every",
        "rl.eval_levels is deprecated; use eval.levels",
    ]
    save_config(cfg, tmp_path / "new.yaml")  # saved under the new keys
    saved = yaml.safe_load((tmp_path / "new.yaml").read_text())
    assert "eval_every" not in saved["rl"] and saved["eval"]["every"] == 7
    assert to_dict(load_config(tmp_path / "new.yaml", [])) == to_dict(cfg)


def test_an_old_dotted_override_loads_with_one_warning(tmp_path, caplog) -> None:
    cfg = load_config(None, ["rl.eval_samples_per_domain=4", "rl.eval_samples_per_domain=4"])
    assert cfg.eval.samples_per_domain == 4
    assert _deprecations(caplog) == [
        "rl.eval_samples_per_domain is deprecated; use eval.samples_per_domain"
    ]
    p = tmp_path / "new.yaml"
    p.write_text("eval:\n  every: 100\n")
    assert load_config(p, ["rl.eval_every=0"]).eval.every == 0  # an override wins, as ever
    p.write_text("rl:\n  eval_every: 100\n")
    assert load_config(p, ["eval.every=0"]).eval.every == 0


@pytest.mark.parametrize(
    ("text", "overrides"),
    [
        ("rl:\n  eval_every: 5\neval:\n  every: 6\n", []),
        ("", ["eval.every=6", "rl.eval_every=5"]),
        ("", ["rl.eval_temperature=1", "eval.temperature=0.5"]),
    ],
)
def test_an_old_and_a_new_key_that_disagree_are_an_error(tmp_path, text, overrides) -> None:
    p = tmp_path / "both.yaml"
    p.write_text(text)
    with pytest.raises(ValueError, match="disagree; the old key is deprecated, give only eval"):
        load_config(p, overrides)
    p.write_text("rl:\n  eval_every: 5\neval:\n  every: 5\n")  # the same value: one warning
    assert load_config(p, ["rl.eval_temperature=1", "eval.temperature=1.0"]).eval.every == 5


def test_a_bad_value_under_an_old_key_names_the_key_and_what_is_allowed() -> None:
    with pytest.raises(ValueError, match=r"eval.temperature must be in \[0, 2\], got -1"):
        load_config(None, ["rl.eval_temperature=-1"])
    with pytest.raises(ValueError, match="eval.samples_per_domain must be an integer"):
        load_config(None, ["rl.eval_samples_per_domain=many"])
    with pytest.raises(ValueError, match="unknown config key eval.'nosuch'"):
        load_config(None, ["eval.nosuch=1"])
