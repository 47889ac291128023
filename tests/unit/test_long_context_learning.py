"""The pieces of the long-context learning run that need no torchrun: which micro-batches the
length switch splits (long_context/cp_switch.py), the per-level before/after report and its
picture (train/level_eval.py), the SFT data of the warm start (long_context/sft_data.py) and the
benchmark record (benchmarks/studies/long_context_learning.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from megatron_rl.domains.base import split_of
from megatron_rl.evaluation.levels import accuracy_png, level_report
from megatron_rl.model.cp.switch import SPLIT, empty_like, owners
from megatron_rl.packing.batch import pack

ROOT = Path(__file__).resolve().parents[2]


def batch(*lengths: int):  # type: ignore[no-untyped-def]
    seqs = [[1] * n for n in lengths]
    return pack(seqs, [[1.0] * n for n in lengths], extras={"adv": [[0.5] * n for n in lengths]})


def test_switch_splits_only_long_micro_batches_and_balances_the_rest() -> None:
    batches = [batch(300, 200), batch(5000), batch(600), batch(100, 100), batch(4096)]
    got = owners(batches, min_tokens=4096, cp=2)
    assert got[1] == SPLIT and got[4] == SPLIT  # a sequence of >= 4096 tokens: split
    whole = {i: got[i] for i in (0, 2, 3)}
    assert set(whole.values()) == {0, 1}
    load = [sum(batches[i].num_tokens for i, r in whole.items() if r == rank) for rank in (0, 1)]
    assert sorted(load) == [600, 700]  # LPT: 600 to one rank, then 500 and 200 to the other
    assert owners(batches, min_tokens=0, cp=2) == [SPLIT] * 5  # switch off
    assert owners(batches, min_tokens=4096, cp=1) == [SPLIT] * 5


def test_empty_stand_in_trains_nothing() -> None:
    e = empty_like(batch(7, 3))
    assert e.num_tokens == 1 and e.seq_ids == [] and float(e.loss_mask.sum()) == 0.0
    assert set(e.extras) == {"adv"} and e.extras["adv"].shape == (1,)


def sweep(scores: dict[str, list[float]], tokens: float) -> dict:
    return {
        "prompt_tokens": tokens,
        "domains": {
            d: {"ids": [f"{d}:{i}" for i in range(len(s))], "scores": s} for d, s in scores.items()
        },  # fmt: skip
    }


def test_level_report_pairs_prompts_and_reports_errors() -> None:
    before = {"1": sweep({"a": [1.0, 0.0, 1.0, 0.0], "b": [0.0, 0.0]}, 514.0),
              "4": sweep({"a": [0.0, 0.0, 0.0, 1.0], "b": [0.0, 0.0]}, 4098.0)}  # fmt: skip
    after = {"1": sweep({"a": [1.0, 1.0, 1.0, 0.0], "b": [1.0, 0.0]}, 514.0),
             "4": sweep({"a": [1.0, 1.0, 0.0, 1.0], "b": [1.0, 0.0]}, 4098.0)}  # fmt: skip
    promos = [{"step": 3, "event": "promote", "domain": "a", "from_level": 1, "to_level": 2,
               "pass_rate": 0.7}]  # fmt: skip
    rep = level_report(before, after, promos)
    rows = {r["level"]: r for r in rep["levels"]}
    assert rows[1]["tokens"] == 514 and rows[4]["distinct"] == 6
    assert rows[1]["before"] == pytest.approx(2 / 6) and rows[1]["after"] == pytest.approx(4 / 6)
    assert rows[4]["gain"] == pytest.approx(3 / 6)
    diffs = [1, 1, 0, 0, 1, 0]  # level 4, paired
    sd = math.sqrt(sum((d - 0.5) ** 2 for d in diffs) / 5)
    assert rows[4]["gain_stderr"] == pytest.approx(sd / math.sqrt(6))
    assert rows[4]["per_domain"]["a"] == {"before": 0.25, "after": 0.75, "distinct": 4}
    assert rep["highest_level_reached"] == 2 and rep["promotions"] == promos
    other = {"1": sweep({"a": [0.0] * 4, "c": [0.0, 0.0]}, 514.0), "4": after["4"]}
    with pytest.raises(ValueError, match="different prompts"):
        level_report(before, other, promos)


def test_accuracy_picture_is_drawn(tmp_path: Path) -> None:
    before = {"1": sweep({"a": [1.0, 0.0]}, 514.0), "3": sweep({"a": [0.0, 0.0]}, 2050.0)}
    after = {"1": sweep({"a": [1.0, 1.0]}, 514.0), "3": sweep({"a": [1.0, 0.0]}, 2050.0)}
    png = accuracy_png(level_report(before, after, []), tmp_path / "acc.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_sft_data_is_training_split_only(tmp_path: Path) -> None:
    from long_context.sft_data import write_pairs

    out = tmp_path / "sft.jsonl"
    assert write_pairs(out, 90, 180, 400, seed=3) == 90
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["kind"] for r in rows} == {"digit_needle", "kv_lookup", "multi_needle", "which_line"}
    assert all(split_of(r["prompt"]) == "train" and 180 <= len(r["prompt"]) <= 400 for r in rows)
    assert all(r["response"] in r["prompt"] or r["kind"] == "multi_needle" for r in rows)
    with pytest.raises(ValueError, match="unknown kind"):
        write_pairs(out, 1, 180, 400, seed=3, kinds=["needle"])
    assert write_pairs(out, 40, 100, 400, seed=3, kinds=["digit_needle"]) == 40  # one record
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(len(r["response"]) == 1 and r["response"] in r["prompt"] for r in rows)


def test_benchmark_record_checks_the_acceptance_gains(tmp_path: Path) -> None:
    from benchmarks.studies import long_context_learning as lcl

    before = {"3": sweep({"a": [0.0] * 10}, 2050.0), "4": sweep({"a": [0.0] * 10}, 4098.0)}
    after = {"3": sweep({"a": [1.0] * 5 + [0.0] * 5}, 2050.0),
             "4": sweep({"a": [1.0] + [0.0] * 9}, 4098.0)}  # fmt: skip
    promos = [{"step": s, "event": "promote", "domain": "a", "from_level": lv, "to_level": lv + 1,
               "pass_rate": 0.7} for s, lv in ((2, 1), (5, 2))]  # fmt: skip
    run = tmp_path / "run"
    run.mkdir()
    summary = {"levels": level_report(before, after, promos), "steps": 6, "wall_s": 12.0}
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "metrics.jsonl").write_text(
        json.dumps(
            {"step": 0, "train/response_tokens": 8.0, "sched/a/level": 1.0, "sys/load_avg_1m": 3.0}
        )
        + "\n"  # fmt: skip
    )
    rec = lcl.record(run)
    assert rec["checks"]["longest_level_reached"] == 3 and rec["checks"]["longest_level_ok"]
    assert rec["checks"]["level_at_least_4k"] == 4 and not rec["checks"]["level_4k_ok"]
    assert rec["checks"]["promotions"] == 2 and rec["load_avg_1m"]["mean"] == 3.0
    assert rec["trained_levels"] == [{"step": 0, "levels": {"a": 1}, "step_s": None}]
