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


def test_rank_files_hold_plain_data_that_loads_weights_only(tmp_path) -> None:
    """The RNG states are stored as ints, lists and tensors: a plain weights-only load reads the
    file, and restoring it replays the same numbers (python, numpy and torch)."""
    import numpy as np

    mgr = CheckpointManager(tmp_path)
    mgr.save(0, {"rng": rng_state(), "trainer": {"cursor": {"a": 3}, "t": (1, 2.5, None)}})
    ckpt = mgr.latest()
    assert ckpt is not None
    raw = torch.load(ckpt / "rank_00000.pt", map_location="cpu", weights_only=True)
    assert raw["rng"]["format"] == 2 and isinstance(raw["rng"]["numpy"]["key"], list)
    want = (random.random(), np.random.rand(), torch.rand(2))
    set_rng_state(mgr.load_rank_state(ckpt)["rng"])
    got = (random.random(), np.random.rand(), torch.rand(2))
    assert want[:2] == got[:2] and torch.equal(want[2], got[2])
    assert CheckpointManager.format_of(ckpt) == 2


def _legacy_checkpoint(root, step: int = 4):
    """A checkpoint as format 1 wrote it: the generators' own state objects (numpy's ndarray)."""
    import numpy as np

    d = root / "checkpoints" / f"step_{step:06d}"
    d.mkdir(parents=True)
    legacy = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    torch.save({"rng": legacy, "trainer": {}}, d / "rank_00000.pt")
    (d / "meta.json").write_text(json.dumps({"step": step, "time": 0.0, "format_version": 1}))
    return d


def test_a_format_1_checkpoint_fails_clearly_unless_opted_in(tmp_path) -> None:
    import numpy as np
    import pytest

    d = _legacy_checkpoint(tmp_path)
    want = (random.random(), np.random.rand())  # what the saved states draw next
    with pytest.raises(ValueError, match="format 1.*checkpoint.allow_legacy=true"):
        CheckpointManager(tmp_path).load_rank_state(d)
    state = CheckpointManager(tmp_path, allow_legacy=True).load_rank_state(d)
    set_rng_state(state["rng"])
    assert (random.random(), np.random.rand()) == want


def test_a_rank_file_with_code_in_it_is_refused_and_not_run(tmp_path) -> None:
    """A planted rank file (a copied run directory) whose pickle would call a function: the
    load refuses it, even with the legacy opt-in, and the function never runs."""
    import os

    import pytest

    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.mkdir, (str(marker),))

    mgr = CheckpointManager(tmp_path)
    ckpt = mgr.save(1, {"x": 1})
    torch.save({"x": Payload()}, ckpt / "rank_00000.pt")
    for m in (mgr, CheckpointManager(tmp_path, allow_legacy=True)):
        with pytest.raises(ValueError, match="does not load as tensors and plain data"):
            m.load_rank_state(ckpt)
    assert not marker.exists()
    (ckpt / "rank_00000.pt").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="tensors and plain data|not a readable checkpoint"):
        mgr.load_rank_state(ckpt)


def test_saving_a_step_again_swaps_it_in_and_a_cut_swap_is_recovered(tmp_path) -> None:
    mgr = CheckpointManager(tmp_path, keep=2)
    mgr.save(3, {"x": torch.tensor([1])})
    mgr.save(3, {"x": torch.tensor([2])})
    latest = mgr.latest()
    assert latest is not None and latest.name == "step_000003"
    assert int(mgr.load_rank_state(latest)["x"]) == 2
    assert sorted(p.name for p in mgr.root.iterdir()) == ["latest", "step_000003"]
    # a kill between the swap's two renames: only step_000003.old is left of step 3
    (mgr.root / "step_000003").rename(mgr.root / "step_000003.old")
    found = mgr.latest()
    assert found is not None and found.name == "step_000003.old"
    assert CheckpointManager.step_of(found) == 3 and int(mgr.load_rank_state(found)["x"]) == 2
    mgr.save(4, {"x": torch.tensor([4])})  # the next save puts it back
    assert [p.name for p in mgr.list()] == ["step_000003", "step_000004"]
    assert not (mgr.root / "step_000003.old").exists()
