"""The ``sglang`` rollout engine: an async client for SGLang's native HTTP API.

The trainer talks to one URL, ``rollout.urls[0]``: sglang-router in front of the servers (or a
single server). Request and response schemas are SGLang's (:mod:`.sglang_schema`, version cited
there); on CPU machines the servers are :mod:`.server`, which speaks the same API.

How a step's generation works:

* Every sample of every group is its own ``/generate`` request (``n == 1``; a
  ``sampling_seed`` only with ``rollout.sglang.deterministic``, since SGLang ignores it
  otherwise) with a ``rid`` = (call, request, sample); a retry is sent as
  ``<rid>-retry<k>``, since SGLang answers a rid still in flight with 400 "Duplicate request ID"
  (that answer is retried too). Results go into a slot per sample, so a retried request can
  neither be lost nor counted twice, and the router spreads one group over several servers.
* Concurrency is bounded by a semaphore (``rollout.sglang.max_concurrency``). A request that
  fails with a connection error, a timeout, a 5xx, or comes back aborted by a server we did not
  ask to abort, is retried with exponential back-off and jitter, up to ``max_retries`` times.
  The router runs with its own retries disabled (:mod:`launch.servers`), so every retry is
  ours and is counted in :attr:`SGLangEngine.metrics` (``rollout/sglang/retries``...).
* ``generate(..., need_groups=k)`` returns as soon as ``k`` groups are complete. The rest are
  stopped as slime stops them: requests not sent yet are cancelled, every server gets *one*
  ``/abort_request {"abort_all": true}`` (sglang-router does not forward it), and the client
  waits for the aborted answers; a request that reached a server only after its abort (so it
  would hold the next sync's update lock) gets one more round. Unfinished groups come back
  with ``finish_reason == "abort"`` completions (never silently dropped).

Weights: ``update_weights_from_disk`` fans out to every worker the router lists (sglang-router
0.3.2 does not forward that endpoint), and records the path and version in
``<sync_dir>/current_weights.json`` (:mod:`.sglang_versions`) so that a restarted server is
brought to the current weights before it is re-added (:mod:`launch.servers`).
``weight_sync: distributed`` uses :class:`~megatron_rl.rollout.sglang_weights.DistributedWeightSync`
(broadcast in buckets over a group built as SGLang builds it: NCCL on GPUs, gloo against the
embedded server on CPUs), and writes each version to disk in the background, for restarts.

Log-probs: SGLang returns ``log_softmax(logits / T)`` (post-temperature), the convention of
:mod:`.base`; nothing is converted. Start SGLang without ``SGLANG_RETURN_ORIGINAL_LOGPROB``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from megatron_rl.rollout.auth import client_key
from megatron_rl.rollout.base import (
    Completion,
    GenRequest,
    RolloutEngine,
    derive_seed,
    register_engine,
)
from megatron_rl.rollout.sglang_http import RetryableError as RetryableError  # re-export
from megatron_rl.rollout.sglang_http import SGLangClient
from megatron_rl.rollout.sglang_http import parse_completion as parse_completion  # re-export
from megatron_rl.rollout.sglang_http import to_sampling_params as to_sampling_params  # re-export
from megatron_rl.rollout.sglang_versions import VersionLog, recorded_version
from megatron_rl.rollout.sglang_weights import DistributedWeightSync

if TYPE_CHECKING:
    from torch import Tensor

    from megatron_rl.rollout.config import RolloutConfig

log = logging.getLogger(__name__)
T = TypeVar("T")


@register_engine("sglang")
class SGLangEngine(RolloutEngine):
    """Synchronous :class:`RolloutEngine` over :class:`SGLangClient` (loop in a thread)."""

    def __init__(self, cfg: RolloutConfig, model_dir: str, seed: int) -> None:
        if not cfg.urls:
            raise ValueError("rollout.engine=sglang needs rollout.urls=[http://ROUTER:PORT]")
        self.cfg = cfg
        self.seed = seed
        self.calls = 0
        self.model_dir = model_dir
        self.routed_experts = cfg.return_routed_experts
        self.sync_dir = Path(cfg.sync_dir or Path(model_dir).parent / "rollout_weights")
        self.version = recorded_version(self.sync_dir)  # versions only grow, across restarts
        self.versions = VersionLog(self.sync_dir)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._sync: Any = None
        self.client = self._run(self._make_client())
        try:
            self._run(self.client.wait_healthy(cfg.sglang.health_timeout_s))
        except BaseException:
            self.shutdown()  # no open session or loop left behind ("Unclosed client session")
            raise
        if any(Path(model_dir).glob("*.safetensors")):
            # The servers may hold other weights (base model; a resumed run's policy differs).
            self.update_weights_from_disk(model_dir)

    async def _make_client(self) -> SGLangClient:
        shape = self._routes_shape() if self.routed_experts else None
        # the run directory holds the fleet's key: the sync dir's parent (the fleet's default),
        # or the exported weights' (<run_dir>/engine_weights)
        run_dirs = [self.sync_dir.parent, Path(self.model_dir).parent]
        key = client_key(self.cfg.sglang.api_key_file, run_dirs)
        return SGLangClient(
            self.cfg.urls[0], self.cfg.sglang, self.cfg.request_timeout_s, shape, api_key=key
        )

    def _routes_shape(self) -> tuple[int, int]:
        """(layers, top-k) of the served MoE model, from its ``config.json``."""
        config = json.loads((Path(self.model_dir) / "config.json").read_text())
        if not config.get("num_experts_per_tok"):
            raise ValueError(
                f"rollout.return_routed_experts=true: {self.model_dir}/config.json "
                "has no num_experts_per_tok (not an MoE model)"
            )
        return int(config["num_hidden_layers"]), int(config["num_experts_per_tok"])

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @property
    def metrics(self) -> dict[str, float]:
        """Counters since start: requests, retries, failed, aborted (namespaced keys)."""
        out = {f"rollout/sglang/{k}": float(v) for k, v in self.client.metrics.items()}
        if self._sync is not None:  # updates sent again after a fault in the group
            out["rollout/sglang/weight_retries"] = float(self._sync.retries)
        return out

    def _post_async(self, url: str, body: dict[str, Any], timeout_s: float | None = None) -> Any:
        """Start a POST on the client loop; returns a concurrent future (no waiting)."""
        coro = self.client._post(url, body, timeout_s)
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def generate(
        self, requests: list[GenRequest], need_groups: int | None = None
    ) -> list[list[Completion]]:
        call = self.calls
        self.calls += 1
        seeds = [
            r.params.seed if r.params.seed is not None else derive_seed(self.seed, call, i)
            for i, r in enumerate(requests)
        ]
        call_id = f"s{self.seed}-c{call}-{time.monotonic_ns() % 10**9}"
        self.versions.join()  # a restarted server is caught up before it serves this call
        return self._run(self.client.generate(requests, call_id, seeds, need_groups))

    def update_weights_from_disk(self, hf_dir: str) -> float:
        t0 = time.perf_counter()
        self.version += 1
        version = str(self.version)
        self.versions.join()
        self._run(self.client.update_weights_from_disk(str(Path(hf_dir).resolve()), version))
        self.versions.record(str(Path(hf_dir).resolve()), version)
        return time.perf_counter() - t0

    def update_weights(self, hf_state_dict: dict[str, Tensor]) -> float:
        if self.cfg.sglang.weight_sync == "distributed":
            return self._update_distributed(hf_state_dict)
        t0 = time.perf_counter()
        self.versions.join()
        out = self.versions.write(hf_state_dict, self.version + 1)
        return time.perf_counter() - t0 + self.update_weights_from_disk(str(out))

    def _update_distributed(self, hf_state_dict: dict[str, Tensor]) -> float:
        """Broadcast to every server; with ``record_weights`` the version is also written to
        disk (in the background) and recorded, for servers the fleet restarts."""
        if self._sync is None:
            self._sync = DistributedWeightSync(
                self.cfg.sglang,
                self._post_async,
                lambda: self._run(self.client.worker_urls()),
                router_url=self.cfg.urls[0],
                alive=lambda url: self._run(self.client.alive(url)),
            )
        t0 = time.perf_counter()
        self.versions.join()
        self.version += 1
        try:
            self._sync.update(hf_state_dict, str(self.version))
        except RuntimeError as e:  # every rebuild failed: the disk path still works
            log.error(
                "distributed weight update %d failed (%s): loading it from disk", self.version, e
            )
            self.client.metrics["weight_sync_fallbacks"] += 1
            out = str(self.versions.write(hf_state_dict, self.version))
            self._run(self.client.update_weights_from_disk(out, str(self.version)))
            self.versions.record(out, str(self.version))
            return time.perf_counter() - t0
        if self.cfg.sglang.record_weights:
            self.versions.write_async(hf_state_dict, self.version, self._catch_up)
        return time.perf_counter() - t0

    def _catch_up(self, path: str, version: str) -> None:
        """(After the record.) A server the fleet re-added while this version was broadcast
        (it loaded the version recorded before, and was not in the group) loads this one."""
        assert self._sync is not None
        late = sorted(set(self._run(self.client.worker_urls())) - set(self._sync.members))
        if late:
            log.warning("%s joined during the broadcast of version %s: loading it", late, version)
            self._run(self.client.update_weights_from_disk(path, version, urls=late))

    def shutdown(self) -> None:
        if self._loop.is_closed():
            return
        self.versions.join()
        if self._sync is not None:  # servers drop the group (a new trainer builds its own)
            try:
                self._sync.teardown()
            except Exception as e:
                log.warning("weight-update group teardown failed: %s", e)
        if hasattr(self, "client"):
            self._run(self.client.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()
