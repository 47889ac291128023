"""The embedded engine in a child process (``rollout/process_engine.py``) is the same engine.

The contract tests of every engine run on it too (``test_rollout_engines.py``, param
``hf-own-process``). Here: with the same seed and call sequence it returns exactly the samples
of the in-process engine, before and after a weight update through the pipe; a dead child is
reported, not waited on; and where the loop puts its engine (``rollout.process``).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch

from benchmarks.tiny_model import make_tiny_qwen2
from megatron_rl.rollout.base import GenRequest, SamplingParams
from megatron_rl.rollout.build import build_engine
from megatron_rl.rollout.config import RolloutConfig
from megatron_rl.rollout.process_engine import ProcessEngine, oversubscribed, resolve


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_qwen2(tmp_path_factory.mktemp("tiny") / "model", "test", seed=0)


def requests() -> list[GenRequest]:
    return [
        GenRequest([5, 9, 13, 2], SamplingParams(temperature=1.0, max_tokens=8, n=4)),
        GenRequest([7, 7, 1], SamplingParams(temperature=0.7, max_tokens=6, n=3)),
    ]


def samples(engine: object) -> list[tuple[list[int], list[float]]]:
    outs = engine.generate(requests())  # type: ignore[attr-defined]
    return [(list(c.token_ids), [round(x, 5) for x in c.logprobs]) for cs in outs for c in cs]


def test_child_process_returns_the_in_process_samples(model_dir: Path) -> None:
    torch.set_num_threads(1)
    same = build_engine(RolloutConfig(engine="hf"), str(model_dir), seed=3)
    own = build_engine(RolloutConfig(engine="hf", process="own"), str(model_dir), seed=3)
    try:
        assert isinstance(own, ProcessEngine) and own.pid != os.getpid()
        first = samples(same)
        assert samples(own) == first
        assert own.stats["rollout/generated_tokens"] == same.stats["rollout/generated_tokens"]
        from safetensors.torch import load_file

        sd = load_file(str(model_dir / "model.safetensors"))
        bumped = {k: v * 1.5 if k.endswith("proj.weight") else v for k, v in sd.items()}
        same.update_weights(bumped)
        own.update_weights(bumped)
        after = samples(same)
        assert samples(own) == after != samples(build_engine(RolloutConfig(), str(model_dir), 3))
        with pytest.raises(ValueError):  # a bad request fails in the child, raised here
            own.generate([GenRequest([10**6], SamplingParams(max_tokens=2))])
        assert samples(own) == samples(same)  # and the child carries on
    finally:
        own.shutdown()
        same.shutdown()
    assert not own._proc.is_alive()


def test_a_dead_child_is_reported(model_dir: Path) -> None:
    own = build_engine(RolloutConfig(engine="hf", process="own"), str(model_dir), seed=0)
    assert isinstance(own, ProcessEngine)
    os.kill(own.pid, signal.SIGKILL)
    own._proc.join(10)
    with pytest.raises(RuntimeError, match=r"process \(pid \d+\) died during generate"):
        own.generate(requests())
    own.shutdown()


def test_where_the_loop_runs_its_engine() -> None:
    auto = RolloutConfig(engine="hf")
    assert resolve(auto, off_policy=False, train_threads=1).process == "same"
    own = resolve(auto, off_policy=True, train_threads=1)
    cores = os.cpu_count() or 1
    assert own.process == "own" and own.threads == max(1, cores - 1)
    assert resolve(RolloutConfig(engine="hf", threads=3), True, 1).threads == 3
    assert resolve(RolloutConfig(engine="sglang"), True, 1).process == "same"  # a client already
    assert resolve(RolloutConfig(engine="hf", process="same"), True, 1).process == "same"
    assert oversubscribed(1, 1, cores=2) is None
    assert "3 torch threads on 2 cores" in str(oversubscribed(2, 1, cores=2))
    with pytest.raises(ValueError, match="rollout.process must be auto, same or own"):
        RolloutConfig(process="elsewhere").validate()  # type: ignore[arg-type]
