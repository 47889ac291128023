"""Trainer rank 0 -> every SGLang server: weights by broadcast (``weight_sync: distributed``).

Protocol (SGLang's HTTP API; group construction in :mod:`.weight_group`):

1. ``/init_weights_update_group`` to every server at once (server ``i`` holds ranks
   ``1 + i * engine_tp`` onwards), while rank 0 builds its end of the group on the store it
   hosts; the answers are awaited after the group is built (the rendezvous needs everyone).
2. Per update and bucket (at most ``bucket_mb`` MiB): ``/update_weights_from_distributed`` with
   the bucket's ``names``/``dtypes``/``shapes`` to every server, then rank 0 broadcasts the
   tensors in that order; ``flush_cache`` on the last bucket only, ``abort_all_requests`` on
   the first (nothing may hold a server's update lock while the group waits for it).

Faults (docs/serving.md, "Weight-group faults"): no fault in the group may kill the controller
or stall it for longer than one bucket's timeout.

* Every bucket waits at most ``bucket_timeout_s`` for its broadcast and for the servers'
  answers; a server that died, or accepted the group but never joins its (lazily created, on
  NCCL) communicator, costs that long at most. NCCL faults raise here instead of tearing the
  process down (:func:`.weight_group.contain_nccl_faults`).
* A failed bucket aborts rank 0's end of the group, which releases the survivors blocked in it
  (they also leave it on their own after the same timeout, or when the next
  ``/init_weights_update_group`` comes); the group is never reused.
* Members that no longer answer at all (connection refused: the process is gone) are left out
  of the rebuild even while the router still lists them, and the whole update is sent again to
  the rest: one retry, not a stall. A server the fleet restarts comes back on a new port, is
  brought to the recorded version from disk before it is re-added, and joins the group at the
  next update (membership is compared with the router's list before every update).
"""

from __future__ import annotations

import concurrent.futures
import datetime
import itertools
import logging
import socket
import threading
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from megatron_rl.rollout import weight_group

if TYPE_CHECKING:
    from collections.abc import Callable

    from torch import Tensor

    from megatron_rl.rollout.config import SGLangConfig

log = logging.getLogger(__name__)
_GENERATIONS = itertools.count()  # group names are unique per process (torch's registry)


def reachable_addr(peer_url: str) -> str:
    """This host's address on the route to ``peer_url`` (the router): what servers can reach.

    Not ``gethostbyname(gethostname())``, which is often 127.0.1.1 on Debian-style hosts.
    Connecting a UDP socket sends nothing; it only picks the outgoing interface.
    """
    host = urlparse(peer_url).hostname or "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((socket.gethostbyname(host), 9))
        return str(s.getsockname()[0])


class DistributedWeightSync:
    """See the module docstring. ``post(url, body, timeout_s=None)`` returns a future of the
    JSON answer; ``workers()`` lists the server URLs behind the router; ``alive(url)`` says
    whether anything answers at ``url`` (default: always)."""

    GROUP = "weight_update_group"

    def __init__(
        self,
        cfg: SGLangConfig,
        post: Callable[..., Any],
        workers: Callable[[], list[str]],
        router_url: str = "",
        backend: str | None = None,
        group: Any = None,
        alive: Callable[[str], bool] | None = None,
    ) -> None:
        import torch

        self.cfg = cfg
        self.post = post
        self.workers = workers
        self.alive = alive or (lambda url: True)
        self.addr = cfg.master_addr or reachable_addr(router_url)
        cuda = torch.cuda.is_available()
        self.backend = backend or ("nccl" if cuda else "gloo")
        self.device = "cuda" if self.backend == "nccl" else "cpu"
        self.group = group  # injected by tests (an object with broadcast(tensors))
        self.members: list[str] = list(workers()) if group is not None else []
        self.dead: set[str] = set()  # listed by the router, but nothing answers there
        self.name = self.GROUP
        self.store: Any = None
        self.timeout = datetime.timedelta(seconds=cfg.group_timeout_s)
        self.bucket_timeout = datetime.timedelta(seconds=cfg.bucket_timeout_s)
        self.retries = 0  # updates sent again after a fault (a metric)

    @property
    def world_size(self) -> int:
        return 1 + len(self.members) * self.cfg.ranks_per_server()

    # ---- the group ------------------------------------------------------------------------
    def current_members(self) -> list[str]:
        """The router's servers, less those known dead (forgotten once the router drops them)."""
        listed = sorted(self.workers())
        self.dead &= set(listed)
        return [u for u in listed if u not in self.dead]

    def ensure_group(self) -> None:
        """Build the group, or rebuild it when the servers changed."""
        members = self.current_members()
        if not members:
            raise RuntimeError("the router lists no live rollout servers to send weights to")
        if self.group is not None and members == self.members:
            return
        if self.group is not None:
            log.warning("rollout servers changed %s -> %s: rebuilding", self.members, members)
            self.teardown()
        for attempt in range(self.cfg.group_retries + 1):
            try:
                self._build(members)
                return
            except Exception as e:
                log.warning("weight-update group %s failed (attempt %d): %s", self.name, attempt, e)
                self._drop(members)
                if attempt == self.cfg.group_retries:
                    raise RuntimeError(
                        f"could not build the weight-update group with {members} after "
                        f"{attempt + 1} attempts: {e}"
                    ) from e
                time.sleep(min(0.5 * 2.0**attempt, 5.0))
                members = self.current_members()

    def _build(self, members: list[str]) -> None:
        self.members = members
        gen = next(_GENERATIONS)
        self.name = self.GROUP if gen == 0 else f"{self.GROUP}-{gen}"
        if self.store is None:
            self.store = weight_group.host_store(self.addr, self.cfg.master_port, self.timeout)
        futures = [
            self.post(
                f"{url}/init_weights_update_group",
                {
                    "master_address": self.addr,
                    "master_port": self.cfg.master_port,
                    "rank_offset": 1 + i * self.cfg.ranks_per_server(),
                    "world_size": self.world_size,
                    "group_name": self.name,
                    "backend": self.backend,
                },
            )
            for i, url in enumerate(members)
        ]
        self.group = _build_watching(
            lambda: weight_group.trainer_group(
                self.store, self.world_size, self.name, self.backend, self.timeout
            ),
            futures,
        )
        _check_all(futures, "init_weights_update_group", self.timeout.total_seconds())
        log.info("weight-update group %s: rank 0 + %s", self.name, members)

    def teardown(self) -> None:
        """Drop the group here and ask the servers to drop theirs (errors only logged)."""
        futures = [
            self.post(f"{url}/destroy_weights_update_group", {"group_name": self.name}, 30)
            for url in self.members
        ]
        for f in futures:
            try:
                f.result(timeout=30)
            except Exception as e:  # a dead server has nothing to destroy
                log.info("destroy_weights_update_group: %s", e)
        if weight_group.is_group(self.group):
            weight_group.destroy(self.group)
        self.group, self.members = None, []

    def _drop(self, members: list[str]) -> None:
        """After a fault: abort rank 0's end at once (the survivors blocked in the group are
        released), mark the members nothing answers at as dead, waiting for nobody."""
        if weight_group.is_group(self.group):
            weight_group.destroy_later(self.group)
        gone = {u for u in members if not self.alive(u)}
        if gone:
            log.warning("rollout servers %s do not answer: left out of the group", sorted(gone))
        self.dead |= gone
        for url in set(members) - gone:  # they leave it anyway at the next init
            self.post(f"{url}/destroy_weights_update_group", {"group_name": self.name}, 10)
        self.group, self.members = None, []

    # ---- updates --------------------------------------------------------------------------
    def buckets(self, state: dict[str, Tensor]) -> list[list[tuple[str, Tensor]]]:
        """Consecutive groups of tensors of at most ``bucket_mb`` MiB (a bigger tensor alone)."""
        from megatron_rl.model.hf_io import group_by_bytes

        plan = group_by_bytes(state, self.cfg.bucket_mb * 2**20)
        out = [[(name, state[name]) for name in names] for names in plan]
        return [b for b in out if b]

    def update(self, state: dict[str, Tensor], version: str) -> float:
        """Send ``state`` to every live server; after a fault (a broadcast or an answer that
        failed or timed out) the group is rebuilt without the dead and the update sent again."""
        t0 = time.perf_counter()
        for attempt in range(self.cfg.group_retries + 1):
            self.ensure_group()
            members = list(self.members)
            try:
                self._send(state, version)
                return time.perf_counter() - t0
            except Exception as e:
                if attempt == self.cfg.group_retries:
                    self._drop(members)
                    raise
                log.warning("weight update %s failed (%s): rebuilding the group", version, e)
                self.retries += 1
                self._drop(members)
        raise AssertionError("unreachable")

    def _send(self, state: dict[str, Tensor], version: str) -> None:
        buckets = self.buckets(state)
        wait_s = self.bucket_timeout.total_seconds()
        for k, bucket in enumerate(buckets):
            body = {
                "names": [n for n, _ in bucket],
                "dtypes": [str(t.dtype).removeprefix("torch.") for _, t in bucket],
                "shapes": [list(t.shape) for _, t in bucket],
                "group_name": self.name,
                "flush_cache": k == len(buckets) - 1,
                "abort_all_requests": k == 0,
                "weight_version": version,
            }
            futures = [
                self.post(f"{url}/update_weights_from_distributed", body, wait_s + 30)
                for url in self.members
            ]
            tensors = [t for _, t in bucket]  # servers receive in the order of "names"
            if weight_group.is_group(self.group):
                weight_group.broadcast_bucket(self.group, tensors, self.device, self.bucket_timeout)
            else:  # a test's stand-in
                self.group.broadcast(tensors)
            _check_all(futures, f"update_weights_from_distributed (bucket {k})", wait_s)


def _build_watching(build: Callable[[], Any], futures: list[Any]) -> Any:
    """Run ``build`` (blocks until every member joined) while watching the servers' answers:
    a server that already answered with an error will never join, so stop waiting for it."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["pg"] = build()
        except BaseException as e:
            out["error"] = e

    thread = threading.Thread(target=run, daemon=True, name="weight-group-build")
    thread.start()
    while thread.is_alive():
        thread.join(0.2)
        for f in futures:
            if f.done() and f.exception() is not None:
                raise RuntimeError(f"a server failed to join: {f.exception()}")
            if f.done() and not (isinstance(f.result(), dict) and f.result().get("success")):
                raise RuntimeError(f"a server failed to join: {f.result()}")
    if "error" in out:
        raise out["error"]
    return out["pg"]


def _check_all(futures: list[Any], what: str, timeout_s: float) -> None:
    """Every server answered success within ``timeout_s``; the first failure raises at once."""
    done, late = concurrent.futures.wait(
        futures, timeout=timeout_s, return_when=concurrent.futures.FIRST_EXCEPTION
    )
    for f in done:
        out = f.result()  # an HTTP/connection error raises here
        if not (isinstance(out, dict) and out.get("success")):
            raise RuntimeError(f"{what} failed on a server: {out}")
    if late:
        raise RuntimeError(f"{what}: {len(late)} server(s) did not answer within {timeout_s:.0f} s")
