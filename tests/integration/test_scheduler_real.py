"""benchmarks/studies/scheduler_real.py (``make bench-scheduler``): every arm generates and
trains the same groups per step, the extract and statistics it reports, the seesaw statistics,
the recompute script against the committed JSON, and the quick mode of real training."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.harness import read_text, rel
from benchmarks.studies import scheduler_pair as sp
from benchmarks.studies import scheduler_real as sr
from benchmarks.studies import scheduler_runs as runs
from benchmarks.studies import scheduler_stats as st

ROOT = Path(__file__).resolve().parents[2]
STORED = ROOT / "benchmarks" / "studies" / "scheduler_real.json.gz"  # the per-run extract


def test_seeds_fixed_apart_and_every_competing_arm_plans_the_same_groups(tmp_path) -> None:
    assert len(sr.REPORT_SEEDS) >= 6 and len(sr.ABLATION_SEEDS) >= 3
    assert not set(sr.REPORT_SEEDS) & set(sr.DEV_SEEDS)
    a = sr.parse(["--run-dir", str(tmp_path)])
    arms = {**sr.CORE, **sr.ABLATIONS, **sr.ORACLE_CANDIDATES, **sr.ADAPTIVE_VARIANTS}
    planned = runs.planned_groups(arms, a)
    assert planned.pop(sr.PROBE) == 4 * sr.PROMPTS  # the probe: 4x, reported, not competing
    assert set(planned.values()) == {2 * sr.PROMPTS}
    assert len(a.domains) == 8 and a.eval_n >= 128


def test_d2_confirmation_runs_fresh_seeds_and_plans_equal_groups(tmp_path) -> None:
    """The D2 confirmation (docs/scheduler.md, third addendum): seeds no earlier run used, the
    room arm chosen among the dev variants, and the same groups generated and trained by every
    arm of D2's dev and confirmation parts."""
    assert len(sr.CONFIRM_SEEDS) >= 6
    assert not set(sr.CONFIRM_SEEDS) & (set(sr.REPORT_SEEDS) | set(sr.DEV_SEEDS))
    assert sr.ROOM_ARM in sr.ROOM_VARIANTS and sr.ROOM_ARM in sr.D2_CONFIRM
    name, arms, seeds = sr.part_arms("confirm", "D2")
    assert (name, seeds) == ("confirm-D2", sr.CONFIRM_SEEDS)
    assert arms[st.ORACLE] == sr.D2_CORE[st.ORACLE]
    assert sr.part_arms("dev", "D2")[0] == "dev-D2"
    with pytest.raises(ValueError, match="--part confirm is D2's"):
        sr.part_arms("confirm", "D1")
    a = sr.parse(["--set", "D2", "--run-dir", str(tmp_path)])
    planned = runs.planned_groups({**sr.D2_DEV, **sr.D2_CONFIRM}, a)
    assert set(planned.values()) == {2 * sr.D2_PROMPTS} and len(a.domains) == 12


def test_replication_and_d1_room_parts_use_fresh_seeds_and_the_confirmed_arms() -> None:
    """The fourth addendum: twelve seeds no earlier part used, the confirmation's arms exactly,
    judged on the room arm; and the room arm alone on D1's report seeds, beside its baseline."""
    used = set(sr.REPORT_SEEDS) | set(sr.DEV_SEEDS) | set(sr.CONFIRM_SEEDS)
    name, arms, seeds = sr.part_arms("replicate", "D2")
    assert name == "replicate-D2" and arms == sr.D2_CONFIRM
    assert len(seeds) >= 12 and not set(seeds) & used and seeds == sr.REPLICATE_SEEDS
    assert name in sr.LOOKS and "confirm-D2" in sr.LOOKS  # both judged on the room arm
    assert sr.part_arms("room", "D1") == ("report", {sr.ROOM_ARM: sr.ROOM}, sr.REPORT_SEEDS)
    with pytest.raises(ValueError, match="--part replicate is D2's"):
        sr.part_arms("replicate", "D1")
    with pytest.raises(ValueError, match="choose one of core, dev, confirm, replicate"):
        sr.part_arms("room", "D2")


def test_powered_replication_uses_thirty_fresh_seeds_and_the_confirmed_arms() -> None:
    """The fifth addendum: seeds no earlier part used, the confirmation's arms exactly, judged
    on the room arm as its third registered test; development on seeds that already judged."""
    used = set(sr.REPORT_SEEDS) | set(sr.DEV_SEEDS) | set(sr.CONFIRM_SEEDS)
    used |= set(sr.REPLICATE_SEEDS)
    name, arms, seeds = sr.part_arms("powered", "D2")
    assert name == "powered-D2" and arms == sr.D2_CONFIRM and seeds == sr.POWERED_SEEDS
    assert len(seeds) >= 30 and not set(seeds) & used
    assert sr.LOOKS[name] == 3  # judged on the room arm, its third registered test
    assert sr.LOOKS["replicate-D2"] == 2 and sr.LOOKS["confirm-D2"] == 1
    name, arms, seeds = sr.part_arms("dev5", "D2")
    assert set(seeds) == set(sr.CONFIRM_SEEDS) | set(sr.REPLICATE_SEEDS)
    assert arms[sr.ROOM_ARM] == sr.ROOM and set(sr.UCB_VARIANTS) < set(arms)
    for part in ("dev5", "powered"):
        with pytest.raises(ValueError, match=f"--part {part} is D2's"):
            sr.part_arms(part, "D1")


def test_reuse_copies_only_same_settings_same_arm_runs_of_the_parts_seeds() -> None:
    arms = {"u": ["p=u"], "r": ["p=r"], "v": ["p=v"]}
    src = {"settings": {"x": 1}, "arms": {"u": ["p=u"], "r": ["p=OLD"]}}
    src["runs"] = {"u": {"1": {"k": 1}, "9": {"k": 9}}, "r": {"1": {"k": 2}}}
    doc = {"sections": {"src": src}}
    sec: dict = {"settings": {"x": 1}, "runs": {"u": {"1": {"k": "mine"}}}}
    sr.reuse(doc, sec, arms, (1, 2), ("src",))
    assert sec["runs"] == {"u": {"1": {"k": "mine"}}}  # own run kept; seed 9 not the part's
    sec["runs"] = {}
    sr.reuse(doc, sec, arms, (1, 2), ("src",))
    assert sec["runs"] == {"u": {"1": {"k": 1}}}  # 'r' ran with another config: not reused
    assert sec["reused"] == {"u": {"1": "src"}}
    with pytest.raises(ValueError, match="cannot reuse section 'src'"):
        sr.reuse(doc, {"settings": {"x": 2}, "runs": {}}, arms, (1,), ("src",))


def test_stored_sections_match_the_settings_their_parts_run_now() -> None:
    """Every stored real-training section is reusable from this checkout: its settings are what
    its part would run (the model named inside the repository, not by one checkout's path)."""
    doc = json.loads(read_text(STORED))
    for argv, name in (
        (["--part", "core"], "report"),
        (["--part", "room"], "report"),
        (["--set", "D2", "--part", "core"], "report-D2"),
        (["--set", "D2", "--part", "dev"], "dev-D2"),
        (["--set", "D2", "--part", "confirm"], "confirm-D2"),
        (["--set", "D2", "--part", "replicate"], "replicate-D2"),
        (["--set", "D2", "--part", "dev5"], "dev5-D2"),
    ):
        a = sr.parse(argv)
        assert sr.part_arms(a.part, a.set)[0] == name
        assert json.loads(json.dumps(runs.settings(a))) == doc["sections"][name]["settings"], argv
    assert rel(str(sr.BASE_MODEL)) == "models/tiny-base"
    assert rel("/elsewhere/m") == "/elsewhere/m"


def test_a_section_with_runs_is_refused_under_other_settings_not_emptied(tmp_path) -> None:
    a = sr.parse(["--set", "D2", "--run-dir", str(tmp_path)])
    doc: dict = {}
    sec = sr.section(doc, "s", a)
    sec["runs"]["uniform + filter"] = {"21": {"score": 1}}
    assert sr.section(doc, "s", a) is sec  # same settings: reused
    b = sr.parse(["--set", "D2", "--lr", "1e-3", "--run-dir", str(tmp_path)])
    with pytest.raises(ValueError, match=r"'s' holds 1 runs .*'lr': \(0.0003, 0.001\)"):
        sr.section(doc, "s", b)
    assert doc["sections"]["s"]["runs"] == {"uniform + filter": {"21": {"score": 1}}}
    doc["sections"]["t"] = {"settings": {"old": 1}, "runs": {}}  # nothing stored: reset
    assert sr.section(doc, "t", b)["settings"]["lr"] == 1e-3


def test_learning_rate_is_pinned_per_part_not_taken_from_the_demo(tmp_path) -> None:
    """The demo config's lr moved three times; the registered parts train at 3e-4, the seesaw
    pair at 1e-3, and a run is reused only under the same lr (it is in the settings)."""
    from megatron_rl.config import load_config

    for argv, lr in (([], 3e-4), (["--set", "D2", "--part", "confirm"], 3e-4),
                     (["--part", "seesaw"], 1e-3), (["--lr", "5e-4"], 5e-4)):  # fmt: skip
        a = sr.parse([*argv, "--run-dir", str(tmp_path)])
        cfg = load_config(runs.CONFIG, runs.overrides(sr.CORE[st.BASELINE], 1, a))
        assert (cfg.train.lr, cfg.train.min_lr, cfg.train.lr_schedule) == (lr, 2e-5, "cosine")
        assert runs.settings(a)["lr"] == lr


def write_run(run: Path, trained: list[int]) -> None:
    d = ["x/a", "x/b"]
    sweep = lambda s, v: (
        {"step": s}
        | {
            f"eval/{k}/{m}": x
            for k, base in zip(d, v, strict=True)
            for m, x in (("accuracy", base), ("stderr", 0.01), ("distinct", 128.0))
        }
    )
    rows = [sweep(0, (0.2, 0.5))]
    for s, n in enumerate(trained):
        rows.append(
            {
                "step": s,
                "rollout/groups_generated": 4,
                "rollout/groups_trained": n,
                "rollout/groups_trained_with_signal": 1,
                "sched/x/a/weight": 0.25,
                "sched/x/b/weight": 0.75,
            }
        )
    rows.append(sweep(len(trained), (0.6, 0.4)))
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "summary.json").write_text(json.dumps({"wall_s": 12.5}))
    (run / "events.jsonl").write_text(
        json.dumps({"step": 2, "event": "regression", "domain": "x/b"})
    )


def test_extract_reads_the_runs_own_metrics_and_the_budget_is_checked(tmp_path) -> None:
    write_run(tmp_path / "ok", [2, 2])
    ex = runs.extract(tmp_path / "ok", ["x/a", "x/b"])
    assert [s["step"] for s in ex["sweeps"]] == [0, 2]
    assert ex["sweeps"][1]["domains"]["x/a"] == {
        "primary": 0.6,
        "primary_se": 0.01,
        "greedy": math.nan,
        "greedy_se": math.nan,
        "distinct": 128.0,
        "share": 0.25,
    }
    assert ex["groups_generated"] == [4, 4] and ex["groups_trained"] == [2, 2]
    assert ex["share"] == {"x/a": 0.25, "x/b": 0.75} and len(ex["events"]) == 1
    runs.check_budget("ok", ex, 4, 2)
    write_run(tmp_path / "short", [2, 1])  # one step trained fewer groups
    with pytest.raises(RuntimeError, match=r"trained \[1, 2\] groups per step, expected 4 / 2"):
        runs.check_budget("short", runs.extract(tmp_path / "short", ["x/a", "x/b"]), 4, 2)


def fake_run(final: float, seed: int, events: int = 0, dip: float = 0.0) -> dict:
    """An extract with two domains and three sweeps; the final mean is ``final``."""
    doms = ("x/a", "x/b")
    sw = [
        {d: 0.30 for d in doms},
        {d: 0.30 + 0.01 * (seed % 3) - dip for d in doms},
        {d: final for d in doms},
    ]
    return {
        "sweeps": [
            {
                "step": 10 * k,
                "domains": {
                    d: {"primary": v[d], "primary_se": 0.02, "greedy": v[d], "greedy_se": 0.02}
                    for d in doms
                },  # fmt: skip
            }
            for k, v in enumerate(sw)
        ],
        "groups_generated": [16] * 3,
        "groups_trained": [8] * 3,
        "events": [{"event": "regression", "domain": "x/a", "step": 10}] * events,
    }


def test_statistics_headroom_win_regressions_and_recompute(tmp_path) -> None:
    seeds = range(21, 27)
    base = {s: 0.40 + 0.001 * (s - 21) for s in seeds}
    runs = {
        st.BASELINE: {str(s): fake_run(base[s], s, events=s % 2) for s in seeds},
        st.ORACLE: {str(s): fake_run(base[s] + 0.05 + 0.002 * (s - 21), s) for s in seeds},
        st.ADAPTIVE: {str(s): fake_run(base[s] + 0.03, s) for s in seeds},
    }
    sec = {"runs": runs, "contrasts": {"a - o": [st.ADAPTIVE, st.ORACLE]}}
    out = st.compute(sec)
    o = out["vs_baseline"][st.ORACLE]["primary"]
    assert o["n"] == 6 and o["positive"] == 6 and o["mean"] == pytest.approx(0.055)
    assert o["se"] == pytest.approx(0.002 * (3.5**0.5) / 6**0.5)  # SD of 0, 0.002, ... 0.010
    assert o["ci95"][0] == pytest.approx(0.055 - 2.5706 * o["se"], abs=1e-6)
    assert out["headroom"] is True and out["budget"]["equal"] is True
    ad = out["vs_baseline"][st.ADAPTIVE]["primary"]
    assert ad["mean"] == pytest.approx(0.03) and ad["se"] == pytest.approx(0.0, abs=1e-9)
    assert out["win"] is True  # lower bound 0.03 > 0 and 0.03 >= half of the oracle's 0.055
    assert out["share_of_oracle_gain"] == pytest.approx(0.03 / 0.055)
    assert out["arms"][st.BASELINE]["guard_events_mean"] == pytest.approx(0.5)
    assert out["contrasts"]["a - o"]["mean"] == pytest.approx(-0.025)
    sec["runs"][st.ADAPTIVE] = {str(s): fake_run(base[s] + 0.02, s) for s in seeds}
    assert st.compute(sec)["win"] is False  # 0.02 < 0.0275
    sec["runs"][st.ADAPTIVE] = {str(s): fake_run(base[s] + 0.03, s) for s in seeds}
    # a section that names its own adaptive arm (the D2 confirmation) is judged on that arm
    named = {**sec, "runs": {**runs, "other": runs[st.ADAPTIVE]}, "adaptive_arm": "other"}
    named["runs"][st.ADAPTIVE] = {str(s): fake_run(base[s] + 0.02, s) for s in seeds}
    assert st.compute(named)["win"] is True
    assert "lower_adjusted" not in st.compute(named)  # one registered test: no adjustment
    spread = {str(s): fake_run(base[s] + 0.03 + 0.004 * (s % 2), s) for s in seeds}
    looked = st.compute({**named, "looks": 3, "runs": {**named["runs"], "other": spread}})
    p = looked["vs_baseline"]["other"]["primary"]
    adj = looked["lower_adjusted"]  # Bonferroni over 3 looks: the one-sided 1 - 0.05/3 quantile
    assert adj["looks"] == 3 and adj["lower"] < p["lower95"]
    assert adj["lower"] == pytest.approx(p["mean"] - st.t_quantile(1 - 0.05 / 3, 5) * p["se"])
    # the run's SE: sqrt(0.02^2 + 0.02^2) / 2 domains
    assert out["arms"][st.BASELINE]["per_seed"]["21"]["primary_se"] == pytest.approx(0.02 / 2**0.5)
    doc = {"sections": {"report": {**sec, "stats": json.loads(json.dumps(out))}}}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    assert st.main([str(path)]) == 0
    doc["sections"]["report"]["runs"][st.ADAPTIVE]["22"]["sweeps"][-1]["domains"]["x/a"][
        "primary"
    ] += 0.01  # the extract no longer matches the stored statistics
    path.write_text(json.dumps(doc))
    assert st.main([str(path)]) == 1


def test_budget_is_checked_over_the_competing_arms_and_the_probe_apart() -> None:
    runs = {st.BASELINE: {"21": fake_run(0.4, 21)}, st.ORACLE: {"21": fake_run(0.4, 21)}}
    runs[st.PROBE] = {"21": {**fake_run(0.4, 21), "groups_generated": [32] * 3}}
    b = st.budget_check(runs)
    assert (b["generated"], b["trained"], b["equal"]) == ([16], [8], True)
    assert b["arms"][st.PROBE] == {"generated": [32], "trained": [8]}
    runs[st.ORACLE]["22"] = {**fake_run(0.4, 22), "groups_trained": [8, 7, 8]}
    b = st.budget_check(runs)
    assert (b["trained"], b["equal"]) == ([7, 8], False)


def test_regression_threshold_is_twice_the_baselines_robust_sweep_noise() -> None:
    runs = [fake_run(0.30, s) for s in (21, 22, 23)]  # changes: 0, +0.01, +0.02 then back
    ch = sorted(c for r in runs for c in st.sweep_changes(r))
    assert ch[:2] == pytest.approx([-0.02, -0.02]) and ch[-2:] == pytest.approx([0.02, 0.02])
    tau = st.regression_threshold(runs)
    assert tau == pytest.approx(2 * 1.4826 * 0.01)
    assert st.regressions(fake_run(0.25, 24), tau) == ["x/a", "x/b"]  # 0.05 below the start
    assert st.regressions(fake_run(0.29, 24), tau) == []


def test_t_quantiles_match_the_tables() -> None:
    assert st.t_quantile(0.975, 5) == pytest.approx(2.5706, abs=1e-4)
    assert st.t_quantile(0.95, 5) == pytest.approx(2.0150, abs=1e-4)
    assert st.t_quantile(0.975, 2) == pytest.approx(4.3027, abs=1e-4)
    with pytest.raises(ValueError, match="df >= 1"):
        st.t_quantile(0.95, 0)


def pair_run(b: list[float], a: list[float], flag_at: int | None = None) -> dict:
    steps = [5 * k for k in range(len(b))]
    return {
        "sweeps": [
            {
                "step": s,
                "domains": {
                    "A": {"primary": x, "primary_se": 0.01},
                    "B": {"primary": y, "primary_se": 0.01},
                },
            }
            for s, x, y in zip(steps, a, b, strict=True)
        ],
        "events": []
        if flag_at is None
        else [{"event": "regression", "domain": "B", "step": steps[flag_at]}],
    }


def test_seesaw_statistics_validity_onset_catch_and_return() -> None:
    roles = {"a_only": "A only", "guard": "g", "no_guard": "n"}
    runs = {
        "A only": {"1": pair_run([0.3, 0.25, 0.2], [0.5, 0.6, 0.7])},
        "g": {"1": pair_run([0.3, 0.29, 0.2, 0.22, 0.29], [0.5] * 5, flag_at=3)},
        "n": {"1": pair_run([0.3, 0.29, 0.2, 0.15, 0.12], [0.5] * 5)},
    }
    out = st.compute({"kind": "seesaw", "pair": ["A", "B"], "roles": roles, "runs": runs})
    v = out["validity"]["1"]
    assert v["valid"] and v["a"]["diff"] == pytest.approx(0.2) and v["b"]["z"] < -3
    assert (v["onset"], v["flag"]) == (1, None)  # 0.05 > 2 * sqrt(2) * 0.01; no guard event
    row = out["per_seed"]["1"]
    # onset: 0.3 - 0.2 = 0.1 > 2 * sqrt(2) * 0.01 at sweep 2; flagged at sweep 3; back at 4
    assert row == {
        "onset": 2,
        "flag": 3,
        "caught": True,
        "back_guard": 4,
        "onset_no_guard": 2,
        "back_no_guard": None,
    }
    assert (out["caught"], out["back_sooner"], out["valid_all_seeds"]) == (1, 1, True)


def test_a_stored_run_is_reused_only_under_its_arms_config() -> None:
    """Changing an arm's overrides (say the seesaw pair's mix) reruns it: the stored runs of that
    arm go, the others stay."""
    sec = {"arms": {"a": ["x=1"], "b": ["y=1"]}, "runs": {"a": {"1": {}}, "b": {"1": {}}}}
    assert sr.forget_changed(sec, {"a": ["x=2"], "b": ["y=1"], "c": []}) == ["a"]
    assert set(sec["runs"]) == {"b"} and sec["arms"] == {"a": ["x=2"], "b": ["y=1"], "c": []}


def test_merge_refuses_runs_of_an_arm_run_with_other_overrides(tmp_path) -> None:
    def doc(cfg: list[str]) -> dict:
        sec = {"settings": {"x": 1}, "kind": "seesaw", "pair": ["A", "B"], "arms": {"a": cfg}}
        return {"sections": {"s": sec | {"runs": {"a": {}}}}}

    out, other = tmp_path / "out.json", tmp_path / "other.json"
    out.write_text(json.dumps(doc(["x=1"])))
    other.write_text(json.dumps(doc(["x=2"])))
    with pytest.raises(ValueError, match=r"ran arms \['a'\] with other overrides"):
        sr.merge(out, other)


def test_the_pair_starts_from_its_own_base_and_develops_in_its_own_section(tmp_path) -> None:
    a = sr.parse(["--part", "seesaw", "--run-dir", str(tmp_path)])
    e = sp.pair_args(a)
    assert e.model == str(sp.MODEL) and e.domains == list(sp.PAIR) and e.eval_n >= 256
    assert (sp.MODEL / "model.safetensors").is_file()
    own = sp.pair_args(sr.parse(["--part", "seesaw", "--model", "/m"]))
    assert own.model == "/m"  # a model named on the command line is kept
    share = {arm: json.loads(o.split("=", 1)[1]) for arm, cfg in sp.ARMS.items() for o in cfg
             if o.startswith("scheduler.weights=")}  # fmt: skip
    assert share[sp.ROLES["a_only"]][sp.PAIR[1]] == 0.0
    assert share[sp.ROLES["guard"]] == share[sp.ROLES["no_guard"]]  # only the reaction differs
    assert share[sp.ROLES["guard"]][sp.PAIR[1]] == sp.B_SHARE < 0.5


def test_committed_json_agrees_with_its_extract() -> None:
    """The statistics in the stored scheduler_real.json.gz recompute from its per-run extract
    (the recompute script's default file)."""
    doc = json.loads(read_text(STORED))
    assert "report" in doc["sections"]
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.studies.scheduler_stats"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "report: agrees" in proc.stdout


def test_quick_mode_trains_every_core_arm_and_the_pair(tmp_path) -> None:
    """--quick: real training (3 steps) of the core arms and of the seesaw pair, each run
    checked to generate and train the planned groups at every step; nothing tracked written."""
    out, runs = tmp_path / "q.json", tmp_path / "runs"
    args = ["--quick", "--out", str(out), "--run-dir", str(runs), "--wandb", "disabled"]
    git = ["git", "status", "--porcelain"]
    before = subprocess.run(git, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert sr.main([*args, "--part", "core"]) == 0
    assert sr.main([*args, "--part", "seesaw"]) == 0
    doc = json.loads(out.read_text())["sections"]
    core = doc["quick-report"]
    assert set(core["runs"]) == set(sr.CORE)
    for arm in core["runs"].values():
        (r,) = arm.values()
        assert r["groups_generated"] == [4] * 3 and r["groups_trained"] == [2] * 3
        assert [s["step"] for s in r["sweeps"]] == [0, 1, 3]
        assert all(v["distinct"] == 4 for v in r["sweeps"][-1]["domains"].values())
    budget = core["stats"]["budget"]
    assert (budget["generated"], budget["trained"], budget["equal"]) == ([4], [2], True)
    pair = doc["quick-seesaw"]
    assert set(pair["runs"]) == set(pair["roles"].values()) and "validity" in pair["stats"]
    assert (tmp_path / "q_seesaw.png").stat().st_size > 10_000
    after = subprocess.run(git, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert after == before
