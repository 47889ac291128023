"""Checkpoints are complete or absent; resume picks the newest complete one."""

from __future__ import annotations

import json
import random

import torch

from megatron_rl.train.checkpoint import CheckpointManager, rng_state, set_rng_state


def test_save_list_prune_and_latest(tmp_path) -> None:
    mgr = CheckpointManager(tmp_path, keep=2)
    for step in (0, 1, 2):
        mgr.save(step, {"x": torch.tensor([step])}, lambda d: (d / "extra.txt").write_text("w"))
    names = [p.name for p in mgr.list()]
    assert names == ["step_000001", "step_000002"]
    latest = mgr.latest()
    assert latest is not None and CheckpointManager.step_of(latest) == 2
    assert (latest / "extra.txt").read_text() == "w"
    assert int(mgr.load_rank_state(latest)["x"]) == 2
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step_000002"


def test_half_written_checkpoint_is_ignored_and_cleaned(tmp_path) -> None:
    mgr = CheckpointManager(tmp_path, keep=3)
    mgr.save(5, {"x": 1})
    # a crash mid-save leaves a .tmp folder and a folder without meta.json
    (tmp_path / "checkpoints" / "step_000006.tmp").mkdir()
    (tmp_path / "checkpoints" / "step_000006.tmp" / "meta.json").write_text('{"step": 6}')
    (tmp_path / "checkpoints" / "step_000007").mkdir()
    latest = mgr.latest()
    assert latest is not None and latest.name == "step_000005"
    mgr.save(8, {"x": 2})
    assert not (tmp_path / "checkpoints" / "step_000006.tmp").exists()
    assert json.loads((mgr.latest() / "meta.json").read_text())["step"] == 8


def test_rng_state_round_trip() -> None:
    state = rng_state()
    a = (random.random(), torch.rand(3))
    set_rng_state(state)
    b = (random.random(), torch.rand(3))
    assert a[0] == b[0] and torch.equal(a[1], b[1])
