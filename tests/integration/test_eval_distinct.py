"""The eval harness scores distinct prompts, each once, and says when a split is too small.

The engine is the real ``hf`` engine on the shipped tiny base model; the domains are small
enough that their whole prompt space is enumerated here, so the expected distinct counts are
exact, not estimated.
"""

from __future__ import annotations

import logging
import math
import random
import statistics
from pathlib import Path
from typing import Any

import pytest
import torch

from megatron_rl.domains import Domain, Task, split_of
from megatron_rl.domains.sizes import (
    GeneratorHang,
    estimate_space,
    measure_level,
    space_lower_bound,
)
from megatron_rl.evaluation.evaluate import evaluate, paired_difference, stderr_of
from megatron_rl.evaluation.prompt_sets import build_prompt_set, level_quotas

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "models" / "tiny-base"


class SumDomain(Domain):
    """'a + b' with a, b in 0..span-1 (span**2 prompts); level L adds L to the span."""

    family = "test"
    tier = "core"

    def __init__(self, span: int = 6, levels: tuple[int, ...] = (0,)) -> None:
        self.name = f"test/sum{span}"
        self.span = span
        self.levels = levels

    def prompts(self, level: int = 0) -> set[str]:
        n = self.span + level
        return {f"Calculate {a} + {b}." for a in range(n) for b in range(n)}

    def generate(self, level: int, rng: random.Random) -> tuple[str, str, dict[str, Any]]:
        n = self.span + level
        a, b = rng.randrange(n), rng.randrange(n)
        return f"Calculate {a} + {b}.", str(a + b), {}

    def score(self, task: Task, answer: str) -> tuple[float, dict[str, Any]]:
        return float(answer.strip() == task.gold), {}


@pytest.fixture(scope="module")
def engine() -> Any:
    from transformers import AutoTokenizer

    from megatron_rl.rollout.build import build_engine
    from megatron_rl.rollout.config import RolloutConfig

    torch.set_num_threads(1)
    eng = build_engine(RolloutConfig(engine="hf"), str(BASE), seed=0)
    yield eng, AutoTokenizer.from_pretrained(str(BASE))
    eng.shutdown()


def test_small_space_is_scored_once_per_distinct_prompt(engine: Any, caplog: Any) -> None:
    eng, tok = engine
    dom = SumDomain(6)
    held_out = {p for p in dom.prompts() if split_of(p) == "eval"}
    assert 3 <= len(held_out) < 32  # the space is smaller than the request below
    with caplog.at_level(logging.WARNING, logger="megatron_rl.evaluation.prompt_sets"):
        res = evaluate(eng, tok, {dom.name: dom}, 32, seed=0, max_tokens=6)
    prompts = [task.prompt for task, _, _ in res.records]
    assert len(prompts) == len(set(prompts)) == len(held_out)  # each once, none repeated
    assert set(prompts) == held_out  # and every one the split holds was found
    assert len(res.scores[dom.name]) == len(held_out)
    assert res.metrics()[f"eval/{dom.name}/distinct"] == len(held_out)
    assert res.accuracy[dom.name] == sum(res.scores[dom.name]) / len(held_out)
    warnings = [r.getMessage() for r in caplog.records if dom.name in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert f"holds {len(held_out)} distinct prompts, fewer than the 32 requested" in warnings[0]


def test_prompt_set_is_fixed_stratified_and_warns_once(caplog: Any) -> None:
    dom = SumDomain(30, levels=(0, 1, 2))
    assert level_quotas(dom, 10, None) == [(0, 4), (1, 3), (2, 3)]
    assert level_quotas(dom, 10, 7) == [(0, 10)]  # a level the domain lacks: its easiest
    a = build_prompt_set({dom.name: dom}, 10, seed=3)
    b = build_prompt_set({dom.name: dom}, 10, seed=3)
    assert [t.id for t in a.tasks[dom.name]] == [t.id for t in b.tasks[dom.name]]
    assert [t.level for t in a.tasks[dom.name]] == [0] * 4 + [1] * 3 + [2] * 3
    assert not a.short and all(t.split == "eval" for t in a.tasks[dom.name])
    train = build_prompt_set({dom.name: dom}, 10, seed=3, split="train")
    assert {t.prompt for t in train.tasks[dom.name]}.isdisjoint(
        {t.prompt for t in a.tasks[dom.name]}
    )
    tiny = SumDomain(4)
    with caplog.at_level(logging.WARNING, logger="megatron_rl.evaluation.prompt_sets"):
        s = build_prompt_set({tiny.name: tiny}, 50, seed=0)
    assert s.short == [tiny.name] and len(caplog.records) == 1


def test_sampled_pass_at_1_has_its_error_over_prompts(engine: Any) -> None:
    eng, tok = engine
    dom = SumDomain(40)  # 1600 prompts: room for 16 distinct held-out ones
    kw: dict[str, Any] = dict(seed=1, max_tokens=6, samples=4, temperature=1.0)
    res = evaluate(eng, tok, {dom.name: dom}, 16, **kw)
    scores = res.scores[dom.name]
    assert len(scores) == 16 and len({t.prompt for t, _, _ in res.records}) == 16
    assert all(s in (0.0, 0.25, 0.5, 0.75, 1.0) for s in scores)
    assert res.accuracy[dom.name] == pytest.approx(statistics.fmean(scores))
    assert res.stderr[dom.name] == pytest.approx(statistics.stdev(scores) / 4.0)
    m = res.metrics("eval")
    assert m[f"eval/{dom.name}/distinct"] == 16
    assert m["eval/mean_stderr"] == pytest.approx(res.stderr[dom.name])
    again = evaluate(eng, tok, {dom.name: dom}, 16, **kw)  # same seeds per prompt: same dice
    assert again.scores == res.scores
    with pytest.raises(ValueError, match="temperature > 0"):
        evaluate(eng, tok, {dom.name: dom}, 4, seed=1, max_tokens=6, samples=4)


def test_standard_errors() -> None:
    assert stderr_of([1.0, 0.0, 1.0, 0.0]) == pytest.approx(math.sqrt(1 / 3) / 2)
    assert math.isnan(stderr_of([1.0]))
    gain, se = paired_difference([0.0, 0.0, 1.0, 1.0], [1.0, 0.0, 1.0, 1.0])
    assert gain == pytest.approx(0.25) and se == pytest.approx(stderr_of([1.0, 0, 0, 0]))
    with pytest.raises(ValueError, match="differ in length"):
        paired_difference([0.0], [0.0, 1.0])


def test_space_estimate_recovers_known_sizes() -> None:
    for n, m in ((50, 200), (500, 2048), (5000, 2048)):
        expected_distinct = n * (1 - (1 - 1 / n) ** m)  # exact expectation inverts exactly
        assert estimate_space(m, round(expected_distinct)) == pytest.approx(n, rel=0.02)
    rng = random.Random(0)
    draws = [rng.randrange(800) for _ in range(2000)]
    assert estimate_space(2000, len(set(draws))) == pytest.approx(800, rel=0.1)
    assert math.isinf(estimate_space(100, 100)) and math.isinf(estimate_space(0, 0))
    assert space_lower_bound(100, 100) == pytest.approx(100 * 99 / (2 * math.log(20)))
    assert space_lower_bound(100, 40) == 40.0


def test_measure_level_flags_small_spaces() -> None:
    small = measure_level(SumDomain(6), 0, max_draws=2048, budget_s=10.0)
    held_out = sum(split_of(p) == "eval" for p in SumDomain(6).prompts())
    assert small.space.estimate == pytest.approx(36, rel=0.1)
    assert small.eval.distinct == held_out and small.train.distinct == 36 - held_out
    assert set(small.flags) == {"small_eval", "small_space"}
    big = measure_level(SumDomain(200), 0, max_draws=2048, budget_s=10.0)  # 40,000 prompts
    assert big.flags == [] and big.space.estimate > 10_000
    # stopped once repeat-free draws proved both limits, long before the 2,048-draw cap
    assert big.space.draws < 512 and big.space.distinct == big.space.draws
    assert big.eval.at_least >= 128 and big.space.at_least >= 1000
    mid = measure_level(SumDomain(40), 0, max_draws=2048, budget_s=10.0)  # 1,600: repeats soon
    assert mid.space.draws == 2048 and mid.space.estimate == pytest.approx(1600, rel=0.15)
    capped = measure_level(SumDomain(200), 0, max_draws=20, budget_s=10.0)
    assert capped.space.draws == 20 and capped.flags == ["unknown"]  # too few draws to tell


def test_check_records_sizes_that_list_shows(tmp_path: Path, monkeypatch: Any, capsys: Any) -> None:
    import json

    from launch.cli import main

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert main(["domains", "list", "--json", "tinymix/lcm"]) == 0
    assert "prompt_space" not in json.loads(capsys.readouterr().out)[0]
    assert main(["domains", "check", "tinymix/lcm", "tasks/acceptance_examples"]) == 0
    out = capsys.readouterr().out
    assert "FLAG small_eval,small_space" in out and "recorded in" in out
    assert main(["domains", "list", "--json", "tinymix/lcm", "tasks/*"]) == 0
    entries = {e["name"]: e for e in json.loads(capsys.readouterr().out)}
    lcm = entries["tinymix/lcm"]["prompt_space"]["levels"][0]
    assert lcm["flags"] == ["small_eval", "small_space"] and lcm["space"]["estimate"] < 100
    exact = entries["tasks/acceptance_examples"]["prompt_space"]["levels"][0]
    assert exact["eval"]["exact"] and exact["space"]["distinct"] == exact["space"]["estimate"]
    assert (tmp_path / "megatron-rl" / "domain_sizes.json").is_file()


def test_eval_config_is_validated() -> None:
    from megatron_rl.config import load_config

    base = ROOT / "configs" / "demo_cpu.yaml"
    with pytest.raises(ValueError, match="eval.samples_per_prompt=4 needs eval.temperature"):
        load_config(base, ["eval.samples_per_prompt=4"])
    with pytest.raises(ValueError, match="eval.temperature must be in"):
        load_config(base, ["eval.temperature=-1"])
    with pytest.raises(ValueError, match="eval.train_prompts"):
        load_config(base, ["eval.train_prompts=-2"])
    cfg = load_config(base, ["eval.samples_per_prompt=4", "eval.temperature=1.0"])
    assert cfg.eval.samples_per_prompt == 4


def test_curves_skip_per_level_accuracies() -> None:
    from megatron_rl.scheduler.curves import _is_eval_key

    assert _is_eval_key("eval/tiny/count_bits/accuracy")
    assert not _is_eval_key("eval/tiny/count_bits/level2/accuracy")
    assert not _is_eval_key("eval_train/tiny/count_bits/accuracy")


class LoopingDomain(SumDomain):
    """Loops forever on some draws, as reasoning-gym's arc_1d does at level 3."""

    def generate(self, level: int, rng: random.Random) -> tuple[str, str, dict[str, Any]]:
        if rng.random() < 0.2:
            while True:
                rng.random()
        return super().generate(level, rng)


def test_a_generator_that_hangs_is_reported_not_waited_for() -> None:
    with pytest.raises(GeneratorHang, match="test/sum6 level 0, draw .*: still running"):
        measure_level(LoopingDomain(), 0, max_draws=100, budget_s=60.0, hang_s=0.3)


def test_the_demo_trains_on_domains_with_room() -> None:
    """Every domain of configs/demo_cpu.yaml holds >= 128 distinct eval prompts and >= 1,000 in
    all at the demo's level, so its held-out eval has 128 distinct prompts per domain."""
    from megatron_rl.config import load_config
    from megatron_rl.domains import load_domains

    cfg = load_config(ROOT / "configs" / "demo_cpu.yaml", ["tracking.wandb=disabled"])
    domains = load_domains(cfg.domains.include)
    assert len(domains) == 4
    for d in domains.values():
        size = measure_level(d, cfg.domains.level or 0, max_draws=2048, budget_s=10.0)
        assert size.flags == [], (d.name, size.to_json())
        assert (
            len(build_prompt_set({d.name: d}, 128, cfg.seed, cfg.domains.level).tasks[d.name])
            == 128
        )


def test_a_collapse_to_the_majority_answer_is_shown_beside_the_gain() -> None:
    """A policy that answers "1" to every prompt gains up to the share of golds that are "1";
    the summary rows give that constant baseline and the share of the most common answer."""
    from megatron_rl.evaluation.evaluate import EvalResult
    from megatron_rl.evaluation.prompt_sets import PromptSet
    from megatron_rl.evaluation.sweeps import constant_baseline, domain_rows, format_table

    golds = ["1"] * 6 + ["2"] * 3 + ["3"]
    tasks = [Task("d", "eval", 0, f"id{i}", f"p{i}", g) for i, g in enumerate(golds)]

    def sweep(answers: list[str]) -> dict[str, Any]:
        res = EvalResult(requested=10)
        res.scores["d"] = [float(a == g) for a, g in zip(answers, golds, strict=True)]
        res.levels["d"], res.stderr["d"] = [0] * 10, stderr_of(res.scores["d"])
        res.accuracy["d"] = sum(res.scores["d"]) / 10
        res.records = [(t, a, s) for t, a, s in zip(tasks, answers, res.scores["d"], strict=True)]
        held = PromptSet("eval", 10, tasks={"d": tasks})
        return {
            "accuracy": res.accuracy,
            "result": res.to_json(),
            "constant": constant_baseline(held),
        }

    before = sweep(["1", "2", "2", "3", "1", "2", "2", "3", "1", "2"])  # 3 right, varied
    after = sweep(["1"] * 10)  # one answer for all: 6 right
    row = domain_rows(before, after)["d"]
    assert row["gain"] == pytest.approx(0.3) and row["constant_baseline"] == pytest.approx(0.6)
    assert row["top_answer_share_before"] == pytest.approx(0.5)
    assert row["top_answer_share_after"] == 1.0
    assert after["result"]["top_answer_share"] == {"d": 1.0}
    summary = {"domains": {"d": row}, "mean_before": 0.3, "mean_after": 0.6, "mean_gain": 0.3}
    summary.update(metric={"temperature": 0.0}, steps=1, wall_s=1.0, run_dir="r")
    table = format_table(summary)
    assert "0.600  0.50/1.00" in table and "most common gold" in table
