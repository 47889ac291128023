"""RL-loop options that must do what they say, end to end on a random tiny model.

Two JSONL domains (``tasks/cold``, ``tasks/hot``) with a regex verifier that a random policy
passes about half the time (as in ``test_rl_loop.py``), so GRPO has signal from the first step.
Each test is one short run of the real loop: hf or vLLM engine, Megatron policy, disk sync.
"""

from __future__ import annotations

import json
import math
import string
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from benchmarks.tiny_model import make_tiny_qwen2
from megatron_rl.config import load_config
from megatron_rl.domains import Domain, Task
from megatron_rl.domains.base import Env, Observation
from megatron_rl.model import hf_io

ROOT = Path(__file__).resolve().parents[2]
# The T=1 bound of test_rl_loop.py: trainer and engine agree to fp32 rounding (~1e-6/token); a
# wrong temperature gives errors of 0.1-5 nats.
MISMATCH_BOUND = 1e-3


@pytest.fixture(scope="module")
def setup_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("rlopt")
    make_tiny_qwen2(d / "model", "test", seed=0)
    words = ["cats", "dogs", "rain", "sun", "tea", "maps", "jazz", "snow"] * 4
    rows = [
        {
            "prompt": f"Say something about {w}. #{i}",
            "gold": "a",
            "verifier": "regex",
            "pattern": "[\\s\\S]*[a-m][\\s\\S]*",
            "domain": "tasks/cold" if i % 2 else "tasks/hot",
        }
        for i, w in enumerate(words)
    ]
    (d / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def overrides(d: Path, run: str, steps: int, *extra: str) -> list[str]:
    return [
        "rl.off_policy=false",  # the demo overlaps; these runs are on-policy unless they ask
        f"output_dir={d / 'runs'}",
        f"run_name={run}",
        f"model.hf_path={d / 'model'}",
        f"domains.task_files=[{d / 'tasks.jsonl'}]",
        "domains.include=['tasks/*']",
        "domains.exclude=[]",
        f"train.steps={steps}",
        "train.threads=1",
        "train.lr=0.01",
        "train.lr_schedule=constant",
        "rl.prompts_per_step=4",
        "rl.group_size=4",
        "eval.samples_per_domain=2",
        "eval.every=0",
        "rollout.max_new_tokens=8",
        "tracking.wandb=disabled",
        "tracking.progress=false",
        "checkpoint.every=0",
        "scheduler.filter_zero_variance=false",
        "scheduler.oversample=1.0",
        *extra,
    ]


def run(d: Path, name: str, steps: int, *extra: str) -> list[dict[str, Any]]:
    from megatron_rl.train.rl import train_rl

    train_rl(load_config(ROOT / "configs/demo_cpu.yaml", overrides(d, name, steps, *extra)))
    lines = (d / "runs" / name / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "rollout/samples" in r]


def final_weights(d: Path, name: str) -> dict[str, torch.Tensor]:
    ckpts = sorted((d / "runs" / name / "checkpoints").glob("step_*"))
    return hf_io.load_hf(ckpts[-1] / "hf")[0]


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_two_domain_temperatures_match_the_engine(setup_dir: Path, engine: str) -> None:
    """Domains sampled at T=0.6 and T=1.4 in the same micro-batches: the trainer's log-probs
    match the engine's to the T=1 bound (at T=1 for both, they were off by 0.1-3 nats)."""
    extra = ["scheduler.domain_temperature={tasks/cold: 0.6, tasks/hot: 1.4}"]
    if engine == "vllm":
        pytest.importorskip("vllm")
        extra += ["rollout.engine=vllm", "rollout.kv_cache_gb=1", "rollout.max_batch=64"]
    rows = run(setup_dir, f"temps_{engine}", 2, *extra)
    assert len(rows) == 2
    for r in rows:
        print(engine, r["step"], r["mismatch/logp_abs_mean"], r["mismatch/logp_abs_max"])
        assert r["sched/tasks/cold/temperature"] == 0.6
        assert r["sched/tasks/hot/temperature"] == 1.4
        assert "rollout/tasks/cold/reward_mean" in r and "rollout/tasks/hot/reward_mean" in r
        assert r["train/response_tokens"] > 0
        assert r["mismatch/logp_abs_mean"] < MISMATCH_BOUND / 10, r["mismatch/logp_abs_mean"]
        assert r["mismatch/logp_abs_max"] < MISMATCH_BOUND, r["mismatch/logp_abs_max"]


def test_kl_in_reward_shapes_rewards_and_changes_the_weights(setup_dir: Path) -> None:
    """Step 0 starts at the reference (penalty ~0); step 1 samples from an updated policy, so
    its rewards carry a KL penalty, and the weights differ from a kl_coef=0 run."""
    kl = ["rl.kl_coef=1.0", "rl.kl_estimator=k1", "rl.kl_in_reward=true"]
    rows = run(setup_dir, "kl_reward", 2, *kl)
    run(setup_dir, "kl_zero", 2)
    assert rows[0]["train/kl_penalty_max"] < 1e-3  # policy == reference at step 0
    assert rows[1]["train/kl_penalty_max"] > 1e-2
    assert "loss/kl" not in rows[1]  # not also a loss term
    # the rewards the advantages were computed from are the verifier's minus the penalty
    shaped = rows[1]["rollout/reward_mean"] - rows[1]["train/kl_penalty_mean"]
    assert rows[1]["train/shaped_reward_mean"] == pytest.approx(shaped, abs=1e-9)
    shaped, plain = final_weights(setup_dir, "kl_reward"), final_weights(setup_dir, "kl_zero")
    diff = max(float((shaped[k] - plain[k]).abs().max()) for k in plain)
    assert diff > 1e-4, diff


def test_entropy_adaptation_heats_below_target_and_never_cools(setup_dir: Path) -> None:
    """Groups report the sampled tokens' entropy; below the target the refill temperature rises,
    far above it the temperature stays at the base (the controller only heats: temperature.py)."""
    flags = ["scheduler.temperature_adapt=entropy", "scheduler.temperature_adapt_rate=0.01"]
    hot = run(setup_dir, "entropy_hot", 2, *flags, "scheduler.temperature_target=50")
    cold = run(setup_dir, "entropy_cold", 2, *flags, "scheduler.temperature_target=0.2")
    for dom in ("tasks/cold", "tasks/hot"):
        ent = [r[f"sched/{dom}/entropy"] for r in hot + cold]
        assert all(math.isfinite(e) and 0.2 < e < 50 for e in ent), ent
        temps = [r[f"sched/{dom}/temperature"] for r in hot]
        assert 1.0 < temps[0] < temps[1], temps
        assert [r[f"sched/{dom}/temperature"] for r in cold] == [1.0, 1.0]


def test_staleness_counts_optimizer_steps_and_evals_see_current_weights(
    setup_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sync_every=2 off-policy: staleness in optimizer steps, evals after a sync, the final eval
    on the final weights, and the engine never called by two threads at once."""
    from megatron_rl.controller import controller

    busy, overlaps, real_start = threading.Lock(), [], controller.start_engine

    def start_engine(*args: Any) -> Any:
        engine = real_start(*args)
        generate = engine.generate

        def exclusive(requests: Any) -> Any:
            if threading.current_thread() is not threading.main_thread():
                time.sleep(2.0)  # a slow prefetch: an eval that does not wait for it collides
            if not busy.acquire(blocking=False):
                overlaps.append(threading.current_thread().name)
                busy.acquire()
            try:
                return generate(requests)
            finally:
                busy.release()

        engine.generate = exclusive
        return engine

    monkeypatch.setattr(controller, "start_engine", start_engine)
    opts = ["rl.off_policy=true", "rollout.sync_every=2", "rl.max_staleness=2", "eval.every=3"]
    rows = run(setup_dir, "stale", 4, *opts)
    # step 2 was generated (prefetched during step 1) before the sync after step 1: 2 behind
    assert [r["rollout/staleness"] for r in rows] == [0, 1, 2, 1]
    # syncs: every 2nd step, before the eval after step 2, and after the last step
    assert [("sync/bytes" in r) for r in rows] == [False, True, True, True]
    assert "eval/mean_accuracy" in rows[2]
    assert not overlaps, overlaps
    synced = load_file(str(setup_dir / "runs" / "stale" / "sync" / "model.safetensors"))
    final = final_weights(setup_dir, "stale")
    assert all(torch.equal(synced[k], final[k]) for k in final)


def test_sync_every_two_syncs_before_the_final_eval(setup_dir: Path) -> None:
    rows = run(setup_dir, "final_sync", 3, "rollout.sync_every=2", "rl.max_staleness=1")
    assert [r["rollout/staleness"] for r in rows] == [0, 1, 0]
    assert [("sync/bytes" in r) for r in rows] == [False, True, True]  # last step syncs
    synced = load_file(str(setup_dir / "runs" / "final_sync" / "sync" / "model.safetensors"))
    final = final_weights(setup_dir, "final_sync")
    assert all(torch.equal(synced[k], final[k]) for k in final)


# ---------------------------------------------------------------------------------- episodes


class _Turns(Env):
    steps: list[str] = []  # every model turn any episode's environment received

    def __init__(self, done_after: int | None) -> None:
        self.done_after, self.n = done_after, 0

    def step(self, model_turn: str) -> Observation:
        _Turns.steps.append(model_turn)
        self.n += 1
        return Observation("<result>ok</result>", self.done_after is not None and self.n >= 2)


class TurnsDomain(Domain):
    """Multi-turn: the environment ends after 2 model turns (``endless``: never)."""

    multi_turn = True
    levels = (0,)

    def __init__(self, endless: bool) -> None:
        self.endless = endless
        self.name = "test/endless" if endless else "test/two_turns"

    def generate(self, level: int, rng: Any) -> tuple[str, str, dict[str, Any]]:
        return f"Talk to the tool {rng.randint(0, 10**6)}.", "x", {}

    def score(self, task: Task, answer: str) -> tuple[float, dict[str, Any]]:
        return 1.0, {}

    def env(self, task: Task) -> Env:
        return _Turns(None if self.endless else 2)


@pytest.fixture(scope="module")
def hf_engine(setup_dir: Path) -> Any:
    from transformers import AutoTokenizer

    from megatron_rl.rollout.build import build_engine
    from megatron_rl.rollout.config import RolloutConfig

    torch.set_num_threads(1)
    engine = build_engine(RolloutConfig(engine="hf"), str(setup_dir / "model"), seed=0)
    yield engine, AutoTokenizer.from_pretrained(str(setup_dir / "model"))
    engine.shutdown()


# any text ends a model turn (not max_tokens, which truncates); the random model also emits
# partial UTF-8, decoded as U+FFFD
STOP = [*string.printable, "\ufffd"]


def test_tool_domains_are_evaluated_with_their_episodes(hf_engine: Any) -> None:
    from megatron_rl.evaluation.evaluate import evaluate

    engine, tok = hf_engine
    _Turns.steps.clear()
    dom = TurnsDomain(endless=False)
    res = evaluate(engine, tok, {dom.name: dom}, 3, seed=0, max_tokens=16, stop=STOP)
    assert len(_Turns.steps) == 6  # 3 episodes x 2 model turns, each answered by the env
    # each is scored on its last model turn (all episodes advance together: turns 4-6)
    assert [text for _, text, _ in res.records] == _Turns.steps[3:]
    assert set(res.accuracy) == {dom.name}


class OneTurnDomain(TurnsDomain):
    multi_turn = False

    def __init__(self) -> None:
        self.name = "test/one_turn"


def test_eval_honours_rollout_stop(hf_engine: Any) -> None:
    from megatron_rl.evaluation.evaluate import evaluate

    engine, tok = hf_engine
    dom = OneTurnDomain()
    full = evaluate(engine, tok, {dom.name: dom}, 4, seed=0, max_tokens=16)
    cut = evaluate(engine, tok, {dom.name: dom}, 4, seed=0, max_tokens=16, stop=STOP)
    pairs = [(a[1], b[1]) for a, b in zip(full.records, cut.records, strict=True)]
    assert all(f.startswith(c) and not any(s in c for s in STOP) for f, c in pairs), pairs
    assert any(len(c) < len(f) for f, c in pairs), pairs


def test_episodes_cut_by_the_turn_cap_are_truncated(hf_engine: Any) -> None:
    from megatron_rl.controller.generate import generate, score
    from megatron_rl.rollout.episodes import MAX_EPISODE_TURNS
    from megatron_rl.rollout.groups import Group
    from megatron_rl.scheduler import GroupSpec

    engine, tok = hf_engine
    _Turns.steps.clear()
    dom = TurnsDomain(endless=True)
    task = dom.task("train", 0)
    groups = generate(engine, tok, {dom.name: dom}, [GroupSpec(dom.name, 0, 1.0)], [task], 2, 6,
                      1.0, STOP)  # fmt: skip
    assert isinstance(groups[0], Group)
    assert len(_Turns.steps) == 2 * MAX_EPISODE_TURNS  # both episodes ran to the cap
    assert [s.finish_reason for s in groups[0].samples] == ["length", "length"]
    score(groups, {dom.name: dom}, truncated_reward=-1.0)
    assert [s.reward for s in groups[0].samples] == [-1.0, -1.0]
