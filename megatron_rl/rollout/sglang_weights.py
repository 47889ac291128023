"""Trainer rank 0 -> every SGLang server: weights by broadcast (``weight_sync: distributed``).

Protocol (SGLang's HTTP API; group construction in :mod:`.weight_group`):

1. ``/init_weights_update_group`` to every server at once (server ``i`` holds ranks
   ``1 + i * engine_tp`` onwards), while rank 0 builds its end of the group on the store it
   hosts; the answers are awaited after the group is built (the rendezvous needs everyone).
2. Per update and bucket (at most ``bucket_mb`` MiB): ``/update_weights_from_distributed`` with
   the bucket's ``names``/``dtypes``/``shapes`` to every server, then rank 0 broadcasts the
   tensors in that order; ``flush_cache`` on the last bucket only.

Membership: the group holds the servers the router listed when it was built. Before every
update the router's list is read again; when it changed (a server died; the fleet restarts
servers on a *new* port, :mod:`launch.servers`), the group is torn down
(``/destroy_weights_update_group`` on the survivors) and built again under a new name with every
current server, so a restarted server rejoins before the next broadcast. A failed build (a
server answered an error, or the rendezvous timed out) is retried ``group_retries`` times.
"""

from __future__ import annotations

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
    """See the module docstring. ``post(url, body)`` returns a future of the JSON answer;
    ``workers()`` lists the server URLs behind the router."""

    GROUP = "weight_update_group"

    def __init__(
        self,
        cfg: SGLangConfig,
        post: Callable[[str, dict[str, Any]], Any],
        workers: Callable[[], list[str]],
        router_url: str = "",
        backend: str | None = None,
        group: Any = None,
    ) -> None:
        import torch

        self.cfg = cfg
        self.post = post
        self.workers = workers
        self.addr = cfg.master_addr or reachable_addr(router_url)
        cuda = torch.cuda.is_available()
        self.backend = backend or ("nccl" if cuda else "gloo")
        self.device = "cuda" if self.backend == "nccl" else "cpu"
        self.group = group  # injected by tests (an object with broadcast(tensors))
        self.members: list[str] = list(workers()) if group is not None else []
        self.name = self.GROUP
        self.store: Any = None
        self.timeout = datetime.timedelta(seconds=cfg.group_timeout_s)

    @property
    def world_size(self) -> int:
        return 1 + len(self.members) * self.cfg.ranks_per_server()

    # ---- the group ------------------------------------------------------------------------
    def ensure_group(self) -> None:
        """Build the group, or rebuild it when the router's servers changed."""
        members = sorted(self.workers())
        if not members:
            raise RuntimeError("the router lists no rollout servers to send weights to")
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
                self.teardown()
                if attempt == self.cfg.group_retries:
                    raise RuntimeError(
                        f"could not build the weight-update group with {members} after "
                        f"{attempt + 1} attempts: {e}"
                    ) from e
                time.sleep(min(2.0**attempt, 10.0))
                members = sorted(self.workers())

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
        _check_all(futures, "init_weights_update_group")
        log.info("weight-update group %s: rank 0 + %s", self.name, members)

    def teardown(self) -> None:
        """Drop the group here and ask the servers to drop theirs (errors only logged)."""
        futures = [
            self.post(f"{url}/destroy_weights_update_group", {"group_name": self.name})
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

    # ---- updates --------------------------------------------------------------------------
    def buckets(self, state: dict[str, Tensor]) -> list[list[tuple[str, Tensor]]]:
        """Consecutive groups of tensors of at most ``bucket_mb`` MiB (a bigger tensor alone)."""
        from megatron_rl.model.hf_io import group_by_bytes

        plan = group_by_bytes(state, self.cfg.bucket_mb * 2**20)
        out = [[(name, state[name]) for name in names] for names in plan]
        return [b for b in out if b]

    def update(self, state: dict[str, Tensor], version: str) -> float:
        """Send ``state`` to every server; a server lost mid-update (broadcast or answer
        failed) gets the group rebuilt and the whole update sent again."""
        t0 = time.perf_counter()
        for attempt in range(self.cfg.group_retries + 1):
            self.ensure_group()
            try:
                self._send(state, version)
                return time.perf_counter() - t0
            except Exception as e:
                if attempt == self.cfg.group_retries:
                    raise
                log.warning("weight update %s failed (%s): rebuilding the group", version, e)
                self.teardown()
                time.sleep(min(2.0**attempt, 10.0))
        raise AssertionError("unreachable")

    def _send(self, state: dict[str, Tensor], version: str) -> None:
        buckets = self.buckets(state)
        for k, bucket in enumerate(buckets):
            body = {
                "names": [n for n, _ in bucket],
                "dtypes": [str(t.dtype).removeprefix("torch.") for _, t in bucket],
                "shapes": [list(t.shape) for _, t in bucket],
                "group_name": self.name,
                "flush_cache": k == len(buckets) - 1,
                "weight_version": version,
            }
            futures = [
                self.post(f"{url}/update_weights_from_distributed", body) for url in self.members
            ]
            tensors = [t for _, t in bucket]  # servers receive in the order of "names"
            if weight_group.is_group(self.group):
                weight_group.broadcast_bucket(self.group, tensors, self.device)
            else:  # a test's stand-in
                self.group.broadcast(tensors)
            _check_all(futures, "update_weights_from_distributed")


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


def _check_all(futures: list[Any], what: str) -> None:
    for f in futures:
        out = f.result()
        if not (isinstance(out, dict) and out.get("success")):
            raise RuntimeError(f"{what} failed on a server: {out}")
