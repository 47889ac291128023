"""Plumbing of benchmarks/: result collection, the markdown table, and the pure arithmetic.

No timing assertions: these check that numbers flow correctly from a benchmark's output to
results.json / results.md, and that the FLOP count, time split and sync fraction are computed
right on hand-made inputs. Benchmarks run as real subprocesses (tiny scripts written here).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest


def mod(name: str) -> Any:
    return importlib.import_module(f"benchmarks.{name}")


@pytest.fixture
def run_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    m = mod("run_all")
    monkeypatch.setattr(m, "OUT", tmp_path / "out")
    monkeypatch.setattr(m, "RESULTS", tmp_path / "results.json")
    monkeypatch.setattr(m, "HERE", tmp_path)
    monkeypatch.setattr(m, "ROOT", tmp_path)  # benchmarks run as modules from here
    monkeypatch.setattr(m, "README", tmp_path / "README.md")
    monkeypatch.setattr(m, "TOP_README", tmp_path / "TOP_README.md")
    return m


def test_headline_table_goes_between_the_top_readme_markers(run_all: Any, tmp_path: Path) -> None:
    top = tmp_path / "TOP_README.md"
    top.write_text("intro\n<!-- results:start -->\nold\n<!-- results:end -->\nrest\n")
    results = {
        "meta": {"date": "d", "cores": 2, "total_s": 10.0},
        "rl_vs_trl": {"tiny": {"step_time_ratio": 0.5, "accuracy": {"megatron_rl": 0.4}}},
    }
    run_all.write_outputs(results)
    text = top.read_text()
    assert "old" not in text and text.startswith("intro") and text.endswith("rest\n")
    assert "| RL vs TRL, tiny: step time megatron-rl / TRL | 0.5 |" in text
    assert (
        "held-out accuracy, megatron-rl | 0.4 |" in text
        and "TRL | " not in text.split("megatron-rl | 0.4 |")[1]
    )
    assert run_all.stale_tables(results) == []
    results["rl_vs_trl"]["tiny"]["step_time_ratio"] = 0.25  # the README now disagrees
    assert run_all.stale_tables(results) == [str(top), str(tmp_path / "results.md")]


def test_partial_run_says_what_it_measured_and_when_the_rest_was(
    run_all: Any, tmp_path: Path, monkeypatch
) -> None:
    """--only merges into the earlier full run; both tables name the partial run, its load and
    the date of the full run behind the other rows (also after a second partial run)."""
    full = {"meta": {"date": "FULL", "cores": 2}, "train": {"status": "ok", "mfu": {"tiny": 0.1}}}
    (tmp_path / "results.json").write_text(json.dumps(full))
    ok = run_all.Bench(script(tmp_path, "q", "json.dump({'x': 1}, open(sys.argv[2], 'w'))\n"),
                       ["--json", "{out}"], 60, takes_threads=False)  # fmt: skip
    monkeypatch.setattr(run_all, "BENCHES", {"q": ok})
    for _ in range(2):
        monkeypatch.setattr(sys, "argv", ["run_all.py", "--only", "q"])
        assert run_all.main() == 0
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["meta"]["only"] == ["q"] and res["meta"]["others_from"] == "FULL"
    assert res["train"]["mfu"] == {"tiny": 0.1}  # the other rows are kept
    head = run_all.headline(res)
    assert (
        head.startswith("From `run_all.py --only q` (")
        and "merged into `make bench` of FULL" in head
    )
    assert "load average" in head
    assert "for q; the other rows FULL" in run_all.markdown(res)
    assert "--only" not in run_all.headline(full) and "the other rows" not in run_all.markdown(full)


def test_tables_come_only_from_results_json(run_all: Any, tmp_path: Path, monkeypatch) -> None:
    """--render regenerates both blocks from results.json, --check finds hand edits, and a quick
    run writes under out/ only (never results.json or a README)."""
    readme = tmp_path / "README.md"
    readme.write_text(f"x\n{run_all.MARK_START}\nhand-written\n{run_all.MARK_END}\n")
    results = {"meta": {"date": "d", "cores": 2}, "train": {"status": "ok", "mfu": {"tiny": 0.1}}}
    (tmp_path / "results.json").write_text(json.dumps(results))
    monkeypatch.setattr(sys, "argv", ["run_all.py", "--check"])
    assert run_all.main() == 1
    monkeypatch.setattr(sys, "argv", ["run_all.py", "--render"])
    assert run_all.main() == 0
    assert "| train | mfu.tiny | 0.1 |" in readme.read_text()
    monkeypatch.setattr(sys, "argv", ["run_all.py", "--check"])
    assert run_all.main() == 0
    before = readme.read_text()
    ok = run_all.Bench(script(tmp_path, "q", "json.dump({'x': 1}, open(sys.argv[2], 'w'))\n"),
                       ["--json", "{out}"], 60, takes_threads=False)  # fmt: skip
    monkeypatch.setattr(run_all, "BENCHES", {"q": ok})
    monkeypatch.setattr(sys, "argv", ["run_all.py", "--quick"])
    assert run_all.main() == 0
    assert readme.read_text() == before
    assert json.loads((tmp_path / "results.json").read_text()) == results
    assert json.loads((tmp_path / "out" / "results.quick.json").read_text())["q"]["raw"] == {"x": 1}


def script(tmp_path: Path, name: str, body: str) -> str:
    """A benchmark module ``name`` in ``tmp_path`` (run as ``python -m name`` from there)."""
    (tmp_path / f"{name}.py").write_text("import json, sys, time\n" + body)
    return name


def test_run_one_collects_json_and_headline(run_all: Any, tmp_path: Path) -> None:
    s = script(tmp_path, "ok", "json.dump({'a': {'b': 2.5}}, open(sys.argv[2], 'w'))\n")
    bench = run_all.Bench(s, ["--json", "{out}"], 60, lambda r: {"b": r["a"]["b"] * 2})
    entry = run_all.run_one("ok", bench, quick=False)
    assert entry["status"] == "ok"
    assert entry["b"] == 5.0
    assert entry["raw"] == {"a": {"b": 2.5}}


def test_run_one_records_failure_timeout_and_parses_stdout(run_all: Any, tmp_path: Path) -> None:
    bad = run_all.Bench(script(tmp_path, "bad", "sys.exit(3)\n"), [], 60)
    assert run_all.run_one("bad", bad, False)["status"] == "failed (exit 3)"
    slow = run_all.Bench(script(tmp_path, "slow", "time.sleep(30)\n"), [], 0.5)
    assert run_all.run_one("slow", slow, False)["status"] == "timeout"
    printed = script(tmp_path, "pr", "print('hello'); print(json.dumps({'rows': [1, 2]}))\n")
    entry = run_all.run_one("pr", run_all.Bench(printed, [], 60, json_out=False), False)
    assert entry["status"] == "ok" and entry["raw"] == {"rows": [1, 2]}


def test_parse_stdout_falls_back_to_tail(run_all: Any) -> None:
    out = run_all.parse_stdout("a\nb\n\nratio 1.5x\n")
    assert out == {"stdout_tail": ["a", "b", "ratio 1.5x"]}


def test_markdown_table_and_readme_block(run_all: Any, tmp_path: Path) -> None:
    results = {
        "meta": {"date": "2026-11-30 17:00 UTC", "cores": 2, "load_avg_1m": 1.25},
        "rl_vs_trl": {
            "status": "ok",
            "step_time_ratio": 0.5,
            "accuracy": {"megatron_rl": 0.25, "trl": 0.125},
            "raw": {"huge": list(range(100))},
            "wall_s": 12.0,
        },
        "train": {"status": "timeout"},
    }
    md = run_all.markdown(results)
    assert "| rl_vs_trl | step_time_ratio | 0.5 |" in md
    assert "| rl_vs_trl | accuracy.trl | 0.125 |" in md
    assert "| train | status | timeout |" in md
    assert "huge" not in md and "2 cores" in md and "wall_s" not in md
    (tmp_path / "README.md").write_text(
        f"# B\n{run_all.MARK_START}\nold\n{run_all.MARK_END}\nend\n"
    )
    run_all.write_outputs(results)
    readme = (tmp_path / "README.md").read_text()
    assert "old" not in readme and md in readme and readme.endswith("end\n")
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["rl_vs_trl"]["accuracy"] == {"megatron_rl": 0.25, "trl": 0.125}
    assert (tmp_path / "results.md").read_text() == md


def test_headline_extractors_give_required_keys(run_all: Any) -> None:
    rollout = {
        "3m": {"params": 1, "transformers": {"tokens_per_s": 100.0}, "hf": {"tokens_per_s": 250.0}}
    }
    assert run_all._rollout(rollout) == {
        "tokens_per_s": {"3m/transformers": 100.0, "3m/hf": 250.0},
        "ratio_vs_transformers": {"3m/hf": 2.5},
    }
    phases = {"generate": {"megatron_rl": 0.1, "trl": 0.5}}
    size = {"step_time_ratio": 0.5, "step_cpu_ratio": 0.6, "step_s": {"megatron_rl": 1.0},
            "trained_tokens_per_s": {"trl": 3.0}, "accuracy": {"trl": 0.2}, "phases": phases,
            "raw": {"huge": []}}  # fmt: skip
    h = run_all._rl_vs_trl({"tiny": size, "m20": dict(size, step_time_ratio=0.25), "wall_s": 9.0})
    assert set(h) == {"tiny", "m20"} and h["m20"]["step_time_ratio"] == 0.25
    assert h["tiny"]["phases"] == phases and "raw" not in h["tiny"]


def test_rl_vs_trl_compares_shared_domains_after_warm_up() -> None:
    """Step times leave out the first (warm-up) step; accuracy is over the domains both report
    (the old benchmark compared 4 domains with 5); trained tokens/s is over the train phase."""
    rvt = mod("rl_vs_trl")

    def run(step_s: float, train_s: float, acc: dict[str, float], lrs: list[float]) -> dict:
        steps = [dict(step=99.0, train=99.0)] + [dict(step=step_s, train=train_s)] * 2
        return {"steps": steps, "lrs": lrs, "tokens": {"real": 300.0, "padded": 400.0},
                "accuracy": acc, "accuracy_before": {"a": 0.1, "b": 0.3}}  # fmt: skip

    mrl = run(1.0, 0.5, {"a": 0.5, "b": 0.25}, [3e-4, 2e-4])
    trl = run(4.0, 2.0, {"a": 0.5, "b": 0.25, "spell": 0.0}, [3e-4, 1e-4])
    res = rvt.compare(mrl, trl)
    assert res["step_time_ratio"] == pytest.approx(0.25)
    assert res["shared_domains"] == ["a", "b"]
    assert res["accuracy"] == {"megatron_rl": 0.375, "trl": 0.375}
    assert res["accuracy_before"] == pytest.approx(0.2)
    assert res["trained_tokens_per_s"]["megatron_rl"] == pytest.approx(100.0 / 0.5)
    assert res["phases"]["train"] == {"megatron_rl": 0.5, "trl": 2.0}
    assert res["padded_token_frac"]["trl"] == pytest.approx(0.25)
    assert res["lr_max_rel_diff"] == pytest.approx(1.0)


def test_rl_vs_trl_reads_a_megatron_run(tmp_path: Path) -> None:
    rvt = mod("rl_vs_trl")
    row = {"time/step_s": 2.0, "time/step_cpu_s": 1.5, "time/train_s": 1.0, "time/log_s": 0.25,
           "perf/trained_tokens_per_s": 100.0, "perf/train_s": 1.0, "train/lr": 3e-4,
           "rollout/response_len_mean": 3.0}  # fmt: skip
    lines = [json.dumps({"step": i, **row}) for i in range(2)] + ['{"eval/mean": 0.5}']
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    summary = {"eval_after": {"a": 0.5}, "eval_before": {"a": 0.25}}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    run = rvt.read_run(tmp_path)
    assert len(run["steps"]) == 2 and run["tokens"]["real"] == 200.0
    assert run["steps"][0]["step_cpu"] == 1.5 and run["steps"][0]["log"] == 0.25
    assert run["steps"][0]["sync"] == 0.0 and run["lrs"] == [3e-4, 3e-4]
    assert rvt.summarize(run, ["a"])["step_cpu_s"] == 1.5


def test_trl_phase_clock_splits_a_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """TRL's step = generate + score + other (rest of batch prep) + log + train (the rest)."""
    tg = mod("trl_grpo")
    clock = tg.PhaseClock()
    clock.last, clock.last_cpu = 10.0, 1.0
    for phase, sec in (("gen_and_score", 3.0), ("generate", 2.0), ("score", 0.5), ("log", 0.25)):
        clock.add(phase, sec)
    monkeypatch.setattr(tg.time, "perf_counter", lambda: 15.0)
    monkeypatch.setattr(tg.time, "process_time", lambda: 5.0)
    clock.step_end()
    row = clock.steps[0]
    assert row == {"generate": 2.0, "score": 0.5, "log": 0.25, "other": 0.5, "train": 1.75,
                   "step": 5.0, "step_cpu": 4.0}  # fmt: skip
    assert clock.current == {} and clock.last == 15.0


def test_step_flops_by_hand() -> None:
    ts = mod("train_step")
    from megatron_rl.model.config import ModelConfig

    cfg = ModelConfig(
        num_layers=2,
        hidden_size=64,
        ffn_hidden_size=128,
        num_attention_heads=2,
        num_query_groups=1,
        vocab_size=100,
    )
    # per layer: q,o 64x64 each; k,v 64x32 each; mlp 3 x 64x128; plus output 64x100
    n = 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128) + 64 * 100
    assert ts.matmul_params(cfg) == n
    assert ts.step_flops(cfg, [10, 20]) == 6 * n * 30 + 12 * 2 * 64 * (100 + 400)


def test_time_split_shares() -> None:
    ts = mod("time_split")
    rows = [
        {"time/step_s": 10.0, "time/generate_s": 6.0, "time/train_s": 3.0, "time/other_s": 1.0},
        {"time/step_s": 10.0, "time/generate_s": 4.0, "time/train_s": 5.0, "time/sync_s": 1.0},
        {"eval/mean_accuracy": 0.5},  # not a step row
    ]
    res = ts.split(rows)
    assert res["steps"] == 2 and res["step_s"] == 10.0
    assert res["share"]["generate"] == pytest.approx(0.5)
    assert res["share"]["sync"] == pytest.approx(0.05)
    assert res["largest"] == "generate"
    with pytest.raises(ValueError, match="no step rows"):
        ts.split([{"x": 1}])


def test_weight_sync_fraction(tmp_path: Path) -> None:
    ws = mod("weight_sync")
    rows = [{"time/step_s": 4.0, "time/sync_s": 0.2, "sync/bytes": 1000.0}] * 3
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sizes = {  # the fraction uses the default sync mode (disk), not memory
        "a": {"bytes": 900.0, "memory_s": 0.1, "disk_s": 0.4},
        "b": {"bytes": 9e6, "memory_s": 9.0, "disk_s": 9.5},
    }
    demo = ws.demo_fraction(path, sizes)
    assert demo is not None and demo["size"] == "a" and demo["step_s"] == 4.0
    assert demo["fraction"] == pytest.approx(0.1) and demo["mode"] == "disk"
    assert demo["run_sync_fraction"] == pytest.approx(0.05)


def test_trl_reward_is_the_domain_verifier() -> None:
    """The reward TRL gets is megatron-rl's: verify + compose_reward on the same task."""
    rvt = mod("trl_grpo")
    from megatron_rl.domains import load_domains
    from megatron_rl.domains.reward import compose_reward

    domains = load_domains(["tiny/chain_sum"], [], [])
    d = domains["tiny/chain_sum"]
    task = d.task("train", 0, 0, 1)
    reward = rvt.make_reward(domains)
    texts = [task.gold, "not a number"]
    got = reward(
        [[{"role": "assistant", "content": t}] for t in texts], [json.dumps(task.to_dict())] * 2
    )
    want = [compose_reward(d.verify(task, t), t, d.reward_weights)[0] for t in texts]
    assert got == want and got[0] > got[1]


def test_threads_are_passed_only_to_scripts_that_take_them(run_all: Any, tmp_path: Path) -> None:
    s = script(tmp_path, "argv", "json.dump(sys.argv[3:], open(sys.argv[2], 'w'))\n")
    takes = run_all.Bench(s, ["--json", "{out}"], 60)
    assert run_all.run_one("a", takes, False, threads=1)["raw"] == ["--threads", "1"]
    plain = run_all.Bench(s, ["--json", "{out}"], 60, takes_threads=False)
    assert run_all.run_one("b", plain, False, threads=1)["raw"] == []


def test_time_to_gain_is_a_bound_when_a_tool_does_not_get_there() -> None:
    g = mod("rl_vs_trl_gain")
    evals = [{"step": 1, "train_s": 4.0, "mean": 0.45}, {"step": 2, "train_s": 8.0, "mean": 0.52}]
    run = {"step_s": [4.0, 4.0, 4.0], "evals": evals}
    assert g.reach(run, 0.5, 100.0) == {"reached": True, "steps": 2, "seconds": 8.0}
    assert g.reach(run, 0.6, 100.0) == {"reached": False, "steps": 3, "seconds": 12.0}
    hit = {"reached": True, "seconds": 8.0}
    miss = {"reached": False, "seconds": 32.0}
    assert g.ratio(hit, dict(hit, seconds=20.0)) == {"ratio": 0.4, "bound": "="}
    assert g.ratio(hit, miss) == {"ratio": 0.25, "bound": "<="}
    assert g.ratio(dict(miss, seconds=8.0), dict(hit, seconds=16.0)) == {"ratio": 0.5,
                                                                         "bound": ">="}  # fmt: skip
    assert g.ratio(miss, miss)["ratio"] is None
    assert mod("rl_vs_trl").median_index([0.5, 0.2, 0.9]) == 0


def test_megatron_run_sweeps_leave_eval_time_out(tmp_path: Path) -> None:
    rvt = mod("rl_vs_trl")
    row = {"time/step_s": 2.0, "time/step_cpu_s": 1.5, "perf/trained_tokens_per_s": 100.0,
           "perf/train_s": 1.0, "train/lr": 3e-4, "rollout/response_len_mean": 3.0,
           "train/response_tokens": 30.0, "time/train_s": 1.0}  # fmt: skip
    rows = [dict(row, step=0), dict(row, step=1, **{"time/eval_s": 1.5,
                                                     "eval/mean_accuracy": 0.5})]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"eval_after": {"a": 0.6}, "eval_before": {"a": 0.25}, "mean_after": 0.6,
               "mean_before": 0.25}  # fmt: skip
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    run = rvt.read_run(tmp_path)
    assert run["evals"] == [{"step": 2, "train_s": 2.5, "mean": 0.5},
                            {"step": 2, "train_s": 2.5, "mean": 0.6}]  # fmt: skip
    assert run["tokens"]["response"] == 60.0 and run["mean_before"] == 0.25
    assert rvt.summarize(run, ["a"])["response_tokens_per_s"] == pytest.approx(30.0)


def test_trl_sweeps_are_left_out_of_the_step_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    tg = mod("trl_grpo")
    clock = tg.PhaseClock()
    now = [0.0]
    monkeypatch.setattr(tg.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(tg.time, "process_time", lambda: now[0])
    clock.last = clock.last_cpu = 0.0
    now[0] = 3.0
    clock.step_end()  # a 3 s step

    def sweep() -> float:
        now[0] += 5.0  # a 5 s sweep
        return 0.42

    clock.sweep(sweep, 1)
    now[0] += 2.0
    clock.step_end()
    assert [r["step"] for r in clock.steps] == [3.0, 2.0]
    assert clock.evals == [{"step": 1, "train_s": 3.0, "mean": 0.42}]


def test_time_to_gain_counts_each_tool_up_to_the_same_cap() -> None:
    g = mod("rl_vs_trl_gain")
    run = {"step_s": [3.0, 3.0, 3.0, 3.0],
           "evals": [{"step": 2, "train_s": 6.0, "mean": 0.31},
                     {"step": 4, "train_s": 12.0, "mean": 0.5}]}  # fmt: skip
    assert g.reach(run, 0.5, 6.0) == {"reached": False, "steps": 2, "seconds": 6.0}
    assert g.reach(run, 0.5, 7.0) == {"reached": False, "steps": 3, "seconds": 9.0}
    assert g.reach(run, 0.5, 100.0)["seconds"] == 12.0
    assert g.reach({"step_s": [], "evals": []}, 0.5, 5.0)["steps"] == 0


def _gain_run(seconds: list[float], means: list[float], start: float = 0.3) -> dict[str, Any]:
    """A stored run of the gain study: a sweep after every step."""
    evals = [{"step": i + 1, "train_s": sum(seconds[: i + 1]), "mean": m}
             for i, m in enumerate(means)]  # fmt: skip
    return {"step_s": seconds, "evals": evals, "start": start, "reward": [0.1] * len(seconds),
            "grad_norm": [1.0] * len(seconds)}  # fmt: skip


def test_time_to_gain_statistics_over_seeds() -> None:
    """Per-seed targets from the like-for-like megatron-rl run's start; the median ratio and the
    t interval of the geometric mean; bounds named; run_all's headline and README text."""
    g = mod("rl_vs_trl_gain")
    runs: dict[str, dict[str, Any]] = {"megatron_rl": {}, "trl": {}, "demo_recipe": {}}
    for seed, (m_at, t_at) in {"1": (2, 4), "2": (1, 4), "3": (3, 4)}.items():
        curve = lambda at: [0.3 if i + 1 < at else 0.41 for i in range(5)]
        runs["megatron_rl"][seed] = _gain_run([1.0] * 5, curve(m_at))
        runs["trl"][seed] = _gain_run([4.0] * 5, curve(t_at))
    runs["demo_recipe"]["1"] = _gain_run([1.0] * 5, [0.3] * 5)  # never gets there
    sec = {"settings": {"cap_s": 100.0}, "runs": runs}
    st = g.compute({"sections": {"gain": sec}})
    assert st["per_seed"]["1"]["ratio"] == {"ratio": 2 / 16, "bound": "="}
    assert st["per_seed"]["1"]["target"] == pytest.approx(0.4)
    lfl = st["like_for_like"]
    assert lfl["n"] == 3 and lfl["median"] == pytest.approx(2 / 16)
    assert lfl["geomean"] == pytest.approx((1 / 16 * 2 / 16 * 3 / 16) ** (1 / 3))
    lo, hi = lfl["ci95"]
    assert lo < lfl["geomean"] < hi and lfl["seeds_not_equal"] == []
    assert st["demo_recipe"]["seeds_not_equal"] == [">="] and st["demo_recipe"]["n"] == 1
    assert st["step_time_ratio"]["median"] == pytest.approx(0.25)
    gap = st["per_step_gap"]  # per seed: megatron-rl's curve above TRL's at 2, 3, 1 sweeps of 5
    assert gap["n"] == 3 and gap["mean"] == pytest.approx(0.11 * 6 / 15) and gap["positive"] == 3
    assert st["demo_per_step_gap"]["n"] == 1 and st["demo_per_step_gap"]["mean"] < 0
    h = mod("run_all")._rl_vs_trl_gain({"time_to_10": st})
    assert h["per_seed"]["2"]["megatron_rl_steps"] == 1 and h["per_seed"]["2"]["trl_seconds"] == 16
    assert h["text"].startswith("0.12, median of 3 seeds; 95% CI of the geometric mean 0.")
    assert h["demo_text"] == "0.31, median of 1 seeds; 1 seed(s) a bound (>=)"
    assert "no seed" in mod("run_all").gain_text({"n": 0, "seeds_not_equal": []})


def test_trl_run_stops_at_the_gain_or_the_cap() -> None:
    clock = mod("trl_grpo").PhaseClock()
    clock.start_mean = 0.3
    clock.steps = [{"step": 5.0}, {"step": 5.0}]
    assert not clock.done(0.1, 20.0) and not clock.done(None, None)
    clock.evals = [{"step": 2, "train_s": 10.0, "mean": 0.39}]
    assert not clock.done(0.1, 20.0)
    clock.evals.append({"step": 2, "train_s": 10.0, "mean": 0.4})
    assert clock.done(0.1, 20.0) and not clock.done(None, 20.0)
    assert clock.done(None, 10.0)  # ten seconds trained: the cap


def test_sandbox_bench_forgives_a_timeout_under_load_but_not_a_wrong_verdict() -> None:
    sb = mod("sandbox_throughput")
    programs = [sb.PASSING, sb.FAILING]
    # the passing program timed out in the sandbox (a loaded machine): alone, both agree
    assert sb.recheck(programs, ["passed", "failed"], ["timeout", "failed"], 5.0) == 1
    assert sb.recheck(programs, ["passed", "failed"], ["passed", "failed"], 5.0) == 0
    with pytest.raises(RuntimeError, match="verdicts differ on program 1"):
        sb.recheck(programs, ["passed", "failed"], ["passed", "passed"], 5.0)  # not a timeout


def test_every_benchmark_is_a_module_of_the_package() -> None:
    """run_all runs each benchmark as ``python -m <module>``: each one is there."""
    ra = mod("run_all")
    for name, bench in ra.BENCHES.items():
        assert bench.module.startswith("benchmarks."), name
        assert importlib.util.find_spec(bench.module) is not None, (name, bench.module)


def test_stored_results_may_be_gzip_and_rewrite_to_the_same_bytes(tmp_path: Path) -> None:
    """harness: a ``.gz`` result is stored gzip with time 0 (the same text, the same bytes) and
    read back as text; other names stay plain text. Stems drop ``.json`` and ``.json.gz``."""
    h = mod("harness")
    text = json.dumps({"a": [1, 2.5]}, indent=1) + "\n"
    gz, plain = tmp_path / "r.json.gz", tmp_path / "r.json"
    h.write_text(gz, text)
    h.write_text(plain, text)
    assert h.read_text(gz) == text and plain.read_text() == text
    assert gz.read_bytes()[:2] == b"\x1f\x8b" and gz.read_bytes()[4:8] == b"\0\0\0\0"
    assert h.to_bytes(gz, text) == gz.read_bytes()
    assert h.stem(gz) == h.stem(plain) == "r"
