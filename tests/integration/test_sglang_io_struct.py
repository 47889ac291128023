"""Our SGLang request bodies and schemas against SGLang's own request dataclasses (0.5.23).

SGLang does not import on a CPU machine: ``sglang.srt.managers.io_struct`` pulls in
``torchvision`` (through the multimodal configs), whose PyPI build is a CUDA build that fails
beside the CPU torch (checked: "operator torchvision::nms does not exist"). So the dataclasses
are read from the source of the pinned wheel instead, which ``launch/setup_env.sh`` unpacks on
CPU machines (``<venv>/share/sglang-src/``): their fields, with those inherited from base
classes in the same file, compared with (a) every key our client really sends (captured from
the production client against a recording server) and (b) the JSON schemas the embedded
server validates with (:mod:`megatron_rl.rollout.sglang_schema`).
"""

from __future__ import annotations

import ast
import asyncio
import sys
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from megatron_rl.rollout import sglang_schema
from megatron_rl.rollout.config import SGLangConfig
from megatron_rl.rollout.sglang_client import DistributedWeightSync, SGLangClient

SRC = Path(sys.prefix) / "share" / "sglang-src" / "sglang" / "srt"
IO_STRUCT = SRC / "managers" / "io_struct.py"
SAMPLING = SRC / "sampling" / "sampling_params.py"
pytestmark = pytest.mark.skipif(
    not IO_STRUCT.is_file(), reason=f"{IO_STRUCT} missing: run launch/setup_env.sh"
)
CLASSES = {  # our endpoint -> SGLang's request dataclass
    "generate": "GenerateReqInput",
    "init_weights_update_group": "InitWeightsUpdateGroupReqInput",
    "update_weights_from_distributed": "UpdateWeightsFromDistributedReqInput",
    "update_weights_from_disk": "UpdateWeightFromDiskReqInput",
    "abort_request": "AbortReq",
    "destroy_weights_update_group": "DestroyWeightsUpdateGroupReqInput",
}


def dataclass_fields(path: Path) -> dict[str, set[str]]:
    """Class name -> annotated fields (with those of base classes defined in the file)."""
    classes = {n.name: n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef)}

    def fields(name: str) -> set[str]:
        node = classes[name]
        own = {s.target.id for s in node.body
               if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}  # fmt: skip
        for base in node.bases:
            if isinstance(base, ast.Name) and base.id in classes:
                own |= fields(base.id)
        return own

    return {name: fields(name) for name in classes}


def sampling_params_fields() -> set[str]:
    """``SamplingParams`` fields (a msgspec struct in 0.5.23; its API fields come first, the
    internal ones after: a superset of what a request may hold)."""
    return dataclass_fields(SAMPLING)["SamplingParams"]


def captured_bodies() -> dict[str, list[dict[str, Any]]]:
    """What the production client sends, by endpoint, against a server that records it."""
    got: dict[str, list[dict[str, Any]]] = {}

    async def record(request: web.Request) -> web.Response:
        got.setdefault(request.path.strip("/"), []).append(await request.json())
        if request.path == "/generate":
            return web.json_response({"text": "", "output_ids": [3], "meta_info": {
                "id": "x", "finish_reason": {"type": "length", "length": 1},
                "output_token_logprobs": [[-0.5, 3, None]]}})  # fmt: skip
        return web.json_response({"success": True, "message": ""})

    async def run() -> None:
        app = web.Application()
        app.router.add_post("/{tail:.*}", record)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        for deterministic in (False, True):
            client = SGLangClient(url, SGLangConfig(deterministic=deterministic), 30)
            from megatron_rl.rollout.base import GenRequest, SamplingParams

            req = GenRequest([1, 2], SamplingParams(max_tokens=3, stop=["x"], stop_token_ids=[9]))
            await client.generate([req], "c", [5], None)
            await client.abort_all([url])
            await client.update_weights_from_disk("/m", "1", urls=[url])
            await client.close()
        await runner.cleanup()

    asyncio.run(run())

    def post(url: str, body: dict[str, Any], timeout_s: float | None = None) -> Future[Any]:
        got.setdefault(url.rsplit("/", 1)[1], []).append(body)
        f: Future[Any] = Future()
        f.set_result({"success": True})
        return f

    class Group:
        def broadcast(self, tensors: list[Any]) -> None:
            pass

    import torch

    sync = DistributedWeightSync(SGLangConfig(master_addr="10.0.0.1"), post, lambda: ["http://a:1"],
                                 group=Group())  # fmt: skip
    sync.update({"w": torch.zeros(2)}, "2")
    sync.teardown()
    return got


def test_every_key_we_send_is_a_field_of_sglangs_dataclass() -> None:
    fields = dataclass_fields(IO_STRUCT)
    sent = captured_bodies()
    assert set(CLASSES) - {"init_weights_update_group"} <= set(sent), sorted(sent)
    for endpoint, bodies in sent.items():
        for body in bodies:
            extra = set(body) - fields[CLASSES[endpoint]]
            assert not extra, (endpoint, CLASSES[endpoint], extra)
    for body in sent["generate"]:
        assert set(body["sampling_params"]) <= sampling_params_fields(), body["sampling_params"]
    seeds = ["sampling_seed" in b["sampling_params"] for b in sent["generate"]]
    assert seeds == [False, True]  # only in deterministic mode


def test_our_schemas_accept_exactly_sglangs_fields() -> None:
    fields = dataclass_fields(IO_STRUCT)
    for endpoint, cls in CLASSES.items():
        ours = set(sglang_schema.SCHEMAS[endpoint]["properties"])
        ours -= {"model"}  # sglang-router 0.3.2 adds it to /generate bodies
        if endpoint == "abort_request":
            ours -= {"rid"}  # AbortReq takes it from its base class in older files
        assert ours <= fields[cls] | {"rid"}, (cls, ours - fields[cls])
        missing = fields[cls] - ours - {"rid", "http_worker_ipc"}
        assert not missing, (cls, "fields a real SGLang client may send", missing)
    sp = set(sglang_schema.SAMPLING_PARAMS["properties"])
    assert sp <= sampling_params_fields(), sp - sampling_params_fields()
