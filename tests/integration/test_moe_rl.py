"""``megatron-rl train`` on the shipped tiny MoE with expert parallelism and routing replay.

Two processes under torchrun (gloo), ``parallel.ep=2``: each rank holds 4 of the 8 experts of
every layer, rank 0 is the controller with the hf engine, which returns the experts it chose;
three RL steps of configs/moe_cpu.yaml on a JSONL task set whose regex verifier gives the random
model's samples mixed rewards. Checked: the run completes, every step trained (with the
mismatch logged with and without replay, and the router's aux / z-losses), the exported HF
checkpoint loads in transformers as a Qwen3-MoE and its experts moved on both EP ranks' shares.
Also: MoE layouts and routing replay that cannot run fail at start-up with one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import safetensors.torch
import torch
from launching import torchrun

from megatron_rl.config import load_config
from megatron_rl.train.preflight import preflight

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "moe_cpu.yaml"
TINY_MOE = ROOT / "models" / "tiny-moe"


def overrides(d: Path) -> list[str]:
    return [f"output_dir={d / 'runs'}", f"domains.task_files=[{d / 'tasks.jsonl'}]",
            "domains.include=['tasks/*']", "domains.exclude=[]", "tracking.wandb=disabled",
            "tracking.progress=false", "eval.samples_per_domain=4"]  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("moe_rl")
    rows = [{"prompt": f"Name a colour, then a number. #{i}", "gold": "a", "verifier": "regex",
             "pattern": "[\\s\\S]*[a-f][\\s\\S]*"} for i in range(16)]  # fmt: skip
    (d / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    torchrun(2, ["-m", "launch.cli", "train", str(CONFIG), "parallel.ep=2", *overrides(d)],
             timeout=600, what="the MoE run")  # fmt: skip
    return d / "runs" / "moe_cpu"


def test_three_steps_with_expert_parallel_and_replay(run: Path) -> None:
    summary = json.loads((run / "summary.json").read_text())
    assert summary["completed"] is True
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss/total" in r]
    assert [r["step"] for r in steps] == [0, 1, 2]
    for r in steps:
        assert r["train/skipped_steps"] == 0.0 and r["train/grad_norm"] > 0
        assert r["train/response_tokens"] > 0
        for key in ("mismatch/logp_abs_mean", "mismatch/logp_abs_mean_no_replay"):
            assert 0.0 <= r[key] < 1e-3, key  # fp32 engine and trainer: the same routing
        assert 0.9 < r["moe/load_balancing_loss"] < 2.0  # 1.0 is perfectly balanced
        assert r["moe/z_loss"] > 0
    config = (
        json.loads((run / "final" / "hf" / "config.json").read_text())
        if (run / "final").exists()
        else None
    )
    ckpts = sorted(run.glob("checkpoints/*/hf"))
    assert ckpts, "no checkpoint with an HF export"
    hf = ckpts[-1]
    config = json.loads((hf / "config.json").read_text())
    assert config["architectures"] == ["Qwen3MoeForCausalLM"] and config["num_experts"] == 8
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(hf)  # loads as a transformers Qwen3-MoE
    new = safetensors.torch.load_file(str(hf / "model.safetensors"))
    old = safetensors.torch.load_file(str(TINY_MOE / "model.safetensors"))
    for e in (0, 7):  # an expert of each EP rank's share was trained and exported
        name = f"model.layers.1.mlp.experts.{e}.down_proj.weight"
        assert not torch.equal(new[name], old[name]), name


@pytest.mark.parametrize(("world", "extra", "message"), [
    ("2", ["parallel.ep=3"], r"parallel.ep=3 must divide model.moe.num_experts=8"),
    ("2", ["parallel.ep=4"], r"world size 2 is not divisible by parallel.ep \* etp \* pp"),
    ("2", ["parallel.tp=2", "parallel.etp=3"], r"parallel.etp=3 is not supported"),
    ("1", ["model.recompute=full"], r"routing_replay=rollout with model.recompute=full"),
    ("1", ["rollout.engine=vllm"], r"rollout.engine=vllm needs a GPU"),
    ("1", ["model.hf_path=models/tiny-base"], r"needs a mixture-of-experts model; model.arch="),
    ("2", ["model.hf_path=models/tiny-base", "rl.routing_replay=off", "parallel.ep=2"],
     r"parallel.ep=2 needs a mixture-of-experts model"),
])  # fmt: skip
def test_impossible_moe_runs_fail_at_start_with_one_line(monkeypatch, tmp_path, world, extra,
                                                         message) -> None:  # fmt: skip
    if "vllm" in " ".join(extra) and torch.cuda.is_available():
        pytest.skip("vLLM returns routed experts on GPU")
    monkeypatch.setenv("WORLD_SIZE", world)
    monkeypatch.chdir(ROOT)
    with pytest.raises(ValueError, match=message) as err:
        preflight(load_config(CONFIG, [f"output_dir={tmp_path}", *extra]), "rl")
    assert "\n" not in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_routing_replay_option_reads_off_as_yaml_writes_it(tmp_path: Path) -> None:
    """YAML 1.1 reads a bare ``off`` as false: the option still means 'off'."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("rl:\n  routing_replay: off\n")
    assert load_config(cfg).rl.routing_replay == "off"
    assert load_config(CONFIG, ["rl.routing_replay=off"]).rl.routing_replay == "off"
    with pytest.raises(ValueError, match=r"rl.routing_replay='always' is not allowed; choose one "
                       r"of \['off', 'rollout'\]"):  # fmt: skip
        load_config(CONFIG, ["rl.routing_replay=always"])
