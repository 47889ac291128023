"""The weight-update process group (trainer rank 0 + every rollout server), built as SGLang does.

Mirrors, on both ends, SGLang's own construction (sgl-project/sglang):

* ``python/sglang/srt/utils`` ``init_custom_process_group``: a ``tcp://`` rendezvous store,
  wrapped in ``PrefixStore(group_name, store)``, handed to torch's private
  ``_new_process_group_helper(world_size, rank, [], backend, store, group_name=...)`` (which adds
  its own ``f"{group_name}/"`` and per-device ``f"{device}/"`` prefixes), and
  ``_world.pg_group_ranks[pg] = {i: i}`` so that ``broadcast(src=0, group=pg)`` means group rank 0;
* ``python/sglang/srt/model_executor/model_runner.py`` ``init_weights_update_group``: rank
  ``rank_offset + tp_rank``; ``update_weights_from_distributed``: one ``torch.empty(shape,
  dtype)`` per name, ``broadcast(src=0)`` in the order of ``names``, then ``load_weights``.

The trainer (rank 0) goes through the same :func:`init_custom_process_group`, so its store keys
are SGLang's, with one deliberate difference: it *hosts* the TCP store itself
(:func:`host_store`) instead of calling ``rendezvous("tcp://...")``. Under torchrun
(``TORCHELASTIC_USE_AGENT_STORE=True`` in every worker) that rendezvous opens a *client* to
``master_addr:master_port`` for rank 0 too, and nobody would serve the store. One hosted store
serves every generation of the group: each rebuild (a server restarted) uses a new group name.

CPU: the same code with ``backend="gloo"`` (the embedded server, :mod:`.server_weights`).

Faults (docs/serving.md, "Weight-group faults"): every bucket waits at most ``timeout`` for its
broadcast (``Work.wait(timeout)``, which raises in the caller on gloo and on NCCL alike), a
failed group is aborted (releasing peers blocked in it) and dropped, never reused, and
:func:`contain_nccl_faults` makes an NCCL fault raise instead of tearing the process down.
"""

from __future__ import annotations

import datetime
import logging
import os
import threading
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)  # torch's default_pg_timeout, as SGLang uses


def init_custom_process_group(
    backend: str,
    world_size: int,
    rank: int,
    group_name: str,
    init_method: str | None = None,
    store: Any = None,
    timeout: datetime.timedelta = DEFAULT_TIMEOUT,
) -> Any:
    """A process group beside the default one; SGLang's ``init_custom_process_group``.

    With ``init_method`` (the server side) the rendezvous store is wrapped in
    ``PrefixStore(group_name, ...)`` here; a caller passing ``store`` has wrapped it already.
    """
    from torch.distributed.distributed_c10d import (
        Backend,
        PrefixStore,
        _new_process_group_helper,
        _world,
        rendezvous,
    )

    if (store is None) == (init_method is None):
        raise ValueError("init_custom_process_group needs exactly one of init_method and store")
    if init_method is not None:
        store, rank, world_size = next(rendezvous(init_method, rank, world_size, timeout=timeout))
        store.set_timeout(timeout)
        store = PrefixStore(group_name, store)
    pg, _ = _new_process_group_helper(
        world_size,
        rank,
        [],
        Backend(backend),
        store,
        group_name=group_name,  # type: ignore[arg-type]
        backend_options=None,
        timeout=timeout,
    )
    _world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


NCCL_FAULT_ENV = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"}  # 2 = CleanUpOnly (see below)


def contain_nccl_faults() -> dict[str, str]:
    """Make NCCL faults raise in the caller rather than kill the process; returns what was set.

    torch reads ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` in every ``ProcessGroupNCCL`` constructor
    (``ProcessGroupNCCL.cpp``; default 3 = SkipCleanUp: tear the process down on a collective
    error or timeout). The weight-update group lives in the controller, whose death ends the
    job, so its faults must surface as exceptions: 2 = CleanUpOnly aborts the communicators and
    leaves the process up. Call this once at process start, before any process group (and any
    NCCL watchdog thread) exists, since setenv races with getenv in other threads (torch's own
    comment at ``getNcclVersion``); an explicit setting by the user is kept.
    """
    return {k: os.environ.setdefault(k, v) for k, v in NCCL_FAULT_ENV.items()}


def host_store(addr: str, port: int, timeout: datetime.timedelta = DEFAULT_TIMEOUT) -> Any:
    """The trainer's TCP store at ``addr:port``, served by this process (see module doc); it
    does not wait for workers, so one store serves groups of any size."""
    return dist.TCPStore(addr, port, None, is_master=True, timeout=timeout, wait_for_workers=False)


def trainer_group(
    store: Any,
    world_size: int,
    group_name: str,
    backend: str,
    timeout: datetime.timedelta = DEFAULT_TIMEOUT,
) -> Any:
    """Rank 0 of ``group_name`` on the hosted ``store``, keys laid out as SGLang lays them."""
    prefixed = dist.PrefixStore(group_name, store)
    return init_custom_process_group(
        backend, world_size, 0, group_name, store=prefixed, timeout=timeout
    )


def server_group(
    master_address: str,
    master_port: int,
    rank: int,
    world_size: int,
    group_name: str,
    backend: str,
    timeout: datetime.timedelta = DEFAULT_TIMEOUT,
) -> Any:
    """A server's member of the group: SGLang's ``init_weights_update_group`` for one rank."""
    return init_custom_process_group(
        backend,
        world_size,
        rank,
        group_name,
        init_method=f"tcp://{master_address}:{master_port}",
        timeout=timeout,
    )


def is_group(obj: Any) -> bool:
    return isinstance(obj, dist.ProcessGroup)


def destroy(pg: Any) -> None:
    """Drop a group (a member died, or the server was asked to); never raises. Aborting first
    releases the peers blocked in one of its broadcasts (gloo: they get "connection closed")."""
    try:
        pg.abort()
    except Exception as e:
        log.info("abort of a weight-update group: %s", e)
    try:
        dist.destroy_process_group(pg)
    except Exception as e:  # a broken group may fail to shut down cleanly
        log.warning("destroying a weight-update group failed: %s", e)


def destroy_later(pg: Any) -> None:
    """:func:`destroy` on a thread of its own: an event loop never waits for a broken group."""
    threading.Thread(target=destroy, args=(pg,), daemon=True, name="weight-group-destroy").start()


def _wait_all(works: list[Any], timeout: datetime.timedelta | None) -> None:
    """Wait for every broadcast of a bucket, ``timeout`` for the whole bucket (None: the
    group's own timeout); a timeout or a broken peer raises ``RuntimeError`` here."""
    deadline = None if timeout is None else datetime.datetime.now() + timeout
    for w in works:
        if deadline is None:
            w.wait()
        else:
            left = max(deadline - datetime.datetime.now(), datetime.timedelta(milliseconds=1))
            w.wait(timeout=left)


def broadcast_bucket(
    pg: Any, tensors: list[torch.Tensor], device: str, timeout: datetime.timedelta | None = None
) -> None:
    """Rank 0: send ``tensors`` in order (what the receivers allocate from names/shapes)."""
    works = [
        dist.broadcast(t.detach().to(device).contiguous(), src=0, group=pg, async_op=True)
        for t in tensors
    ]
    _wait_all(works, timeout)


def receive_bucket(
    pg: Any,
    names: list[str],
    dtypes: list[str],
    shapes: list[list[int]],
    device: str,
    timeout: datetime.timedelta | None = None,
) -> dict[str, torch.Tensor]:
    """A server: one empty tensor per name, filled by rank 0's broadcasts in the same order."""
    if not len(names) == len(dtypes) == len(shapes):
        raise ValueError(f"{len(names)} names, {len(dtypes)} dtypes, {len(shapes)} shapes")
    out: dict[str, torch.Tensor] = {}
    works = []
    for name, dtype, shape in zip(names, dtypes, shapes, strict=True):
        t = torch.empty(shape, dtype=getattr(torch, dtype), device=device)
        works.append(dist.broadcast(t, src=0, group=pg, async_op=True))
        out[name] = t
    _wait_all(works, timeout)
    return out
