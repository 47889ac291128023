"""A checkpoint save cut at any point leaves a loadable ``latest``: the old step or the new one.

Three ways to cut it, each over a real ``CheckpointManager.save`` on local disk:

* a failure injected (monkeypatch) at every filesystem step of the save in turn (each write,
  fsync, rename, removal), the step itself not done;
* a real SIGKILL at every one of those steps, in a forked child process, so nothing after the
  kill runs (no ``except``/``finally`` clean-up);
* a SIGKILL after a few fixed delays into a child that saves large checkpoints back to back, so
  the kill lands in the middle of writes as well.

After each cut the run directory is read as a resume would read it: the newest complete
checkpoint and the one the ``latest`` file names load, hold the state of their own step, and
are the old or the new step; the next save then succeeds and leaves no debris.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

from megatron_rl.train.checkpoint import CheckpointManager

# the filesystem steps of a save: (owner, attribute)
STEPS: list[tuple[Any, str]] = [
    (torch, "save"),
    (Path, "write_text"),
    (Path, "write_bytes"),
    (os, "fsync"),
    (os, "replace"),
    (os, "rename"),
    (os, "mkdir"),
    (os, "unlink"),
    (shutil, "rmtree"),
]


class Cut(BaseException):
    """The injected failure (a BaseException, so that no ``except Exception`` swallows it)."""


@contextmanager
def cut_at(k: int, action: Callable[[], None]) -> Iterator[list[str]]:
    """Run ``action`` instead of the ``k``-th filesystem step (0-based); yields the steps
    seen so far (``k < 0``: count only)."""
    seen: list[str] = []
    originals = [(owner, name, getattr(owner, name)) for owner, name in STEPS]

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def hooked(*a: Any, **kw: Any) -> Any:
            if len(seen) == k:
                action()
            seen.append(name)
            return fn(*a, **kw)

        return hooked

    for owner, name, fn in originals:
        setattr(owner, name, wrap(name, fn))
    try:
        yield seen
    finally:
        for owner, name, fn in originals:
            setattr(owner, name, fn)


def state(step: int, size: int = 64) -> dict[str, Any]:
    return {"x": torch.full((size,), float(step)), "trainer": {"step": step}}


def write_rank0(step: int) -> Callable[[Path], None]:
    def write(tmp: Path) -> None:
        (tmp / "hf").mkdir()
        (tmp / "hf" / "weights.bin").write_bytes(bytes([step % 256]) * 1024)
        (tmp / "config.yaml").write_text(f"step: {step}\n")

    return write


def check(run: Path, allowed: set[int]) -> int:
    """What a resume reads: the newest complete checkpoint, and the one ``latest`` names."""
    mgr = CheckpointManager(run)
    newest = mgr.latest()
    assert newest is not None, sorted(p.name for p in mgr.root.iterdir())
    named = mgr.root / (mgr.root / "latest").read_text()
    for ckpt in (newest, named):
        step = CheckpointManager.step_of(ckpt)
        assert step in allowed, (ckpt, allowed)
        loaded = mgr.load_rank_state(ckpt)
        assert torch.equal(loaded["x"], torch.full_like(loaded["x"], float(step)))
        assert loaded["trainer"] == {"step": step}
        assert (ckpt / "hf" / "weights.bin").read_bytes() == bytes([step % 256]) * 1024
    return CheckpointManager.step_of(newest)


def recovers(run: Path, step: int = 9) -> None:
    """The next save after a cut works and leaves only complete checkpoints and ``latest``."""
    mgr = CheckpointManager(run, keep=1)
    mgr.save(step, state(step), write_rank0(step))
    assert check(run, {step}) == step
    assert sorted(p.name for p in mgr.root.iterdir()) == ["latest", f"step_{step:06d}"]


def fresh(root: Path, name: str) -> Path:
    run = root / name
    CheckpointManager(run, keep=1).save(1, state(1), write_rank0(1))
    return run


def test_a_save_that_completes_takes_these_steps(tmp_path: Path) -> None:
    run = fresh(tmp_path, "count")
    with cut_at(-1, lambda: None) as seen:
        CheckpointManager(run, keep=1).save(2, state(2), write_rank0(2))
    # the rank file and its fsync, the shared files, the fsyncs before the rename, the rename,
    # the fsync of checkpoints/, latest through a temp file, the prune of step 1 after it
    assert seen.count("save") == 1 and seen.count("fsync") >= 6 and "rmtree" in seen
    assert seen.index("rename") > max(i for i, s in enumerate(seen) if s == "save")
    assert check(run, {2}) == 2


def _steps_of_a_save(tmp_path: Path) -> int:
    run = fresh(tmp_path, "steps")
    with cut_at(-1, lambda: None) as seen:
        CheckpointManager(run, keep=1).save(2, state(2), write_rank0(2))
    return len(seen)


def test_a_failure_at_every_step_of_a_save_leaves_the_old_or_the_new_checkpoint(
    tmp_path: Path,
) -> None:
    n = _steps_of_a_save(tmp_path)
    assert n >= 12
    got = []
    for k in range(n):
        run = fresh(tmp_path, f"fail{k}")

        def fail(k: int = k) -> None:
            raise Cut(k)

        with cut_at(k, fail), pytest.raises(Cut):
            CheckpointManager(run, keep=1).save(2, state(2), write_rank0(2))
        got.append(check(run, {1, 2}))
        recovers(run)
    assert got[0] == 1 and got[-1] == 2  # cut first: the old step; cut last (the prune): new


def _save_and_die_at(run: Path, k: int) -> None:
    """In the forked child: SIGKILL itself at the ``k``-th step of saving step 2."""
    with cut_at(k, lambda: os.kill(os.getpid(), signal.SIGKILL)):
        CheckpointManager(run, keep=1).save(2, state(2), write_rank0(2))
    os._exit(0)


def test_a_sigkill_at_every_step_of_a_save_leaves_the_old_or_the_new_checkpoint(
    tmp_path: Path,
) -> None:
    n = _steps_of_a_save(tmp_path)
    fork = multiprocessing.get_context("fork")
    got = []
    for k in range(n + 1):
        run = fresh(tmp_path, f"kill{k}")
        child = fork.Process(target=_save_and_die_at, args=(run, k))
        child.start()
        child.join(120)
        assert child.exitcode == (-signal.SIGKILL if k < n else 0), (k, child.exitcode)
        got.append(check(run, {1, 2}))
        recovers(run)
    assert got[0] == 1 and got[-1] == 2


def _save_forever(run: Path) -> None:
    """In the forked child: big checkpoints back to back until killed."""
    mgr = CheckpointManager(run, keep=2)
    step = 2
    while True:
        mgr.save(step, state(step, size=1 << 20), write_rank0(step))
        step += 1


def test_a_sigkill_at_any_moment_of_back_to_back_saves_leaves_a_loadable_latest(
    tmp_path: Path,
) -> None:
    fork = multiprocessing.get_context("fork")
    for i, delay in enumerate((0.01, 0.05, 0.1, 0.2, 0.4)):
        run = fresh(tmp_path, f"timed{i}")
        child = fork.Process(target=_save_forever, args=(run,))
        child.start()
        time.sleep(delay)
        os.kill(child.pid or 0, signal.SIGKILL)
        child.join(60)
        newest = CheckpointManager(run).latest()
        assert newest is not None
        # it loads with its own step's state, and so does the one latest names (older or it)
        check(run, set(range(1, CheckpointManager.step_of(newest) + 1)))
        recovers(run, step=100_000)  # past any step the child reached
