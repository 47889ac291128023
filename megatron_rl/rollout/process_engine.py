"""An embedded engine (hf, vllm) in a child process of its own, so generation overlaps training.

Why a process: torch's CPU thread count belongs to a process, so an engine in a background
thread of the trainer shares the trainer's intra-op pool (``train.threads=2`` plus a generating
thread is three busy threads on two cores) and its interpreter lock (a small model's decode loop
is Python-bound, so the two threads mostly take turns). A child process has its own interpreter
and ``rollout.threads`` torch threads; with ``train.threads + rollout.threads`` at most the core
count nothing is oversubscribed, and under ``rl.off_policy`` step t+1 is generated there while
the trainer trains step t (``controller/generate.RolloutProducer``).

Why not the embedded SGLang-API server (``megatron-rl serve``), which is also a process: the
SGLang client sends one HTTP request per sample (SGLang's own granularity, for retries and
aborts), so a group's ``n`` samples no longer share one prefill, and every step pays JSON and
HTTP per sample. docs/LOG.md has the measurement. Here a step's requests go to the child as
they are, over a ``multiprocessing`` pipe (pickled ``GenRequest`` lists in, ``Completion`` lists
out), and the child runs the very engine the trainer would have run in-process, with the same
seed and the same call sequence, so the samples are the same.

Protocol: the parent sends ``(op, args)``, one call at a time (a lock guards it); the child
answers ``("ok", result, stats)`` or ``("error", exception)`` (re-raised in the parent with the
engine named). Ops: ``generate``, ``update_weights`` (HF tensors through the pipe),
``update_weights_from_disk``, ``shutdown``. A child that dies is reported with its exit code.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import threading
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from megatron_rl.rollout.base import Completion, GenRequest, RolloutEngine, engine_class

if TYPE_CHECKING:
    from torch import Tensor

    from megatron_rl.rollout.config import RolloutConfig

log = logging.getLogger(__name__)
START_TIMEOUT_S = 600.0  # the child must have built its engine by then


def resolve(rollout: RolloutConfig, off_policy: bool, train_threads: int) -> RolloutConfig:
    """``rollout`` with ``process`` decided ('auto': 'own' under ``rl.off_policy``) and, for a
    child, its torch ``threads`` (:func:`child_threads`)."""
    own = rollout.engine != "sglang" and (
        rollout.process == "own" or (rollout.process == "auto" and off_policy)
    )
    if not own:
        return replace(rollout, process="same")
    return replace(rollout, process="own", threads=child_threads(rollout.threads, train_threads))


def child_threads(rollout_threads: int, train_threads: int, cores: int | None = None) -> int:
    """The child's torch threads: ``rollout.threads``, else the cores the trainer leaves (>= 1)."""
    cores = cores or os.cpu_count() or 1
    return rollout_threads or max(1, cores - (train_threads or cores))


def oversubscribed(train_threads: int, threads: int, cores: int | None = None) -> str | None:
    """A warning line when trainer + child threads exceed the cores (else None)."""
    cores = cores or os.cpu_count() or 1
    total = (train_threads or cores) + threads
    if total <= cores:
        return None
    return (
        f"train.threads={train_threads or cores} + rollout.threads={threads} = {total} torch "
        f"threads on {cores} cores: generation and training compete for cores"
    )


def _child(conn: Any, cfg: RolloutConfig, model_dir: str, seed: int, threads: int) -> None:
    """The child's loop: build the engine, then answer one call at a time until shutdown."""
    import torch

    torch.set_num_threads(threads)
    try:
        engine = engine_class(cfg)(replace(cfg, process="same"), model_dir, seed)  # type: ignore[call-arg]
    except BaseException as e:  # reported to the parent, which raises it
        conn.send(("error", e))
        return
    conn.send(("ok", None, {}))
    while True:
        op, args = conn.recv()
        try:
            result = getattr(engine, op)(*args)
            conn.send(("ok", result, dict(engine.stats)))
        except BaseException as e:  # the parent re-raises it
            conn.send(("error", e))
        if op == "shutdown":
            return


class ProcessEngine(RolloutEngine):
    """``rollout.engine`` run by a child process (see the module docstring).

    ``threads``: the child's torch threads (:func:`child_threads`).
    """

    def __init__(self, cfg: RolloutConfig, model_dir: str, seed: int, threads: int) -> None:
        self.name = cfg.engine
        ctx = mp.get_context("spawn")  # a clean interpreter: no copy of the trainer's state
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_child, args=(child, cfg, model_dir, seed, threads), daemon=True
        )
        self._proc.start()
        child.close()
        self._lock = threading.Lock()
        self.pid = self._proc.pid
        self._answer("start", START_TIMEOUT_S)
        log.info(
            "rollout engine %r runs in its own process (pid %d, %d torch threads)",
            cfg.engine,
            self.pid,
            threads,
        )

    def _died(self, op: str) -> RuntimeError:
        self._proc.join(5)
        return RuntimeError(
            f"rollout engine {self.name!r} process (pid {self.pid}) died during {op} "
            f"(exit code {self._proc.exitcode})"
        )

    def _answer(self, op: str, timeout: float | None = None) -> Any:
        try:
            if not self._conn.poll(timeout):
                self._proc.kill()
                raise RuntimeError(f"rollout engine {self.name!r} process: no answer to {op}")
            reply = self._conn.recv()
        except (EOFError, OSError):
            raise self._died(op) from None
        if reply[0] == "error":
            raise reply[1]
        self.stats = reply[2] or self.stats
        return reply[1]

    def _call(self, op: str, *args: Any) -> Any:
        with self._lock:
            try:
                self._conn.send((op, args))
            except OSError:  # a broken pipe: the child is gone
                raise self._died(op) from None
            return self._answer(op)

    def generate(self, requests: list[GenRequest]) -> list[list[Completion]]:
        out: list[list[Completion]] = self._call("generate", requests)
        return out

    def update_weights(self, hf_state_dict: dict[str, Tensor]) -> float:
        return float(self._call("update_weights", hf_state_dict))

    def update_weights_from_disk(self, hf_dir: str) -> float:
        return float(self._call("update_weights_from_disk", hf_dir))

    def kill(self) -> None:
        """Stop the child at once (a caller's deadline passed; a call in flight then fails)."""
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)

    def shutdown(self) -> None:
        if self._proc.is_alive():
            try:
                self._call("shutdown")
            except (RuntimeError, OSError) as e:
                log.warning("rollout engine process shutdown: %s", e)
            self._proc.join(10)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
