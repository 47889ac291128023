"""Bad input fails alone: per-request validation in the embedded server and the engines.

The server is the real EmbeddedServer (aiohttp on loopback, in a thread) over the real ``hf``
engine on the shipped models/tiny-base (context 512, vocabulary 320, its own tokenizer).
Status codes and messages mirror SGLang's checks (``SamplingParams.verify`` in
python/sglang/srt/sampling/sampling_params.py, the context-length check of
``TokenizerManager._validate_one_request`` in python/sglang/srt/managers/tokenizer_manager.py):
400 with ``{"error": {"message": ...}}`` naming the field.
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import torch
from serve_load import _HOSTILE, HOSTILE_KINDS
from test_sglang import ServerThread

from megatron_rl.rollout.base import GenRequest, SamplingParams, check_requests
from megatron_rl.rollout.config import RolloutConfig
from megatron_rl.rollout.hf_engine import HFEngine
from megatron_rl.rollout.server import EmbeddedServer

torch.set_num_threads(1)
MODEL = Path(__file__).resolve().parents[2] / "models" / "tiny-base"


class PoisonedEngine(HFEngine):
    """The real hf engine, with one injected fault: a batch holding token 299 raises, as the
    40 GB allocation of an over-long prompt did (a fault validation cannot foresee)."""

    POISON = 299

    def generate(self, requests: list[GenRequest]) -> Any:
        self.calls = getattr(self, "calls", 0) + 1
        if any(self.POISON in r.prompt_ids for r in requests):
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory (injected)")
        return super().generate(requests)


@pytest.fixture(scope="module")
def served():
    engine = PoisonedEngine(RolloutConfig(engine="hf"), str(MODEL), seed=0)
    # seeds count (deterministic); no API key: an in-process server (test_fleet_auth has keys)
    server = EmbeddedServer(engine, str(MODEL), max_batch=64, deterministic=True, api_key=None)
    st = ServerThread(server)
    yield st, server
    st.close()


async def _post_many(url: str, bodies: list[Any]) -> list[tuple[int, Any]]:
    async def one(s: aiohttp.ClientSession, body: Any) -> tuple[int, Any]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        async with s.post(f"{url}/generate", data=data) as r:
            return r.status, json.loads(await r.text())

    async with aiohttp.ClientSession() as s:
        return await asyncio.gather(*(one(s, b) for b in bodies))


def _post(url: str, body: Any) -> tuple[int, Any]:
    return asyncio.run(_post_many(url, [body]))[0]


def _valid(i: int, max_new: int = 4) -> dict[str, Any]:
    sp = {"max_new_tokens": max_new, "sampling_seed": i, "temperature": 1.0}
    return {"input_ids": [5 + i % 50, 17, 42], "sampling_params": sp, "return_logprob": True}


@pytest.mark.parametrize("kind", HOSTILE_KINDS)
def test_each_hostile_request_gets_400_naming_its_field(served, kind):
    make, mention = _HOSTILE[kind]
    body = make(__import__("random").Random(0), 320, 512)
    status, out = _post(served[0].url, body)
    assert status == 400, out
    assert mention in out["error"]["message"], out


@pytest.mark.parametrize(
    ("sp", "field"),
    [
        ({"temperature": -1e-9}, "temperature"),
        ({"temperature": math.inf}, "temperature"),
        ({"top_p": -0.1}, "top_p"),
        ({"top_p": math.nan}, "top_p"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": 10**12}, "context length"),
        ({"n": 0}, "n must be"),
        ({"sampling_seed": -1}, "sampling_seed"),
    ],
)
def test_out_of_range_sampling_params_name_the_field(served, sp, field):
    status, out = _post(served[0].url, {"input_ids": [1, 2, 3], "sampling_params": sp})
    assert status == 400 and field in out["error"]["message"], out


def test_a_denormal_temperature_is_greedy_as_in_sglang(served):
    body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 5}}
    greedy = _post(
        served[0].url, body | {"sampling_params": {"max_new_tokens": 5, "temperature": 0}}
    )
    tiny = _post(
        served[0].url, body | {"sampling_params": {"max_new_tokens": 5, "temperature": 5e-324}}
    )
    assert greedy[0] == tiny[0] == 200 and greedy[1]["output_ids"] == tiny[1]["output_ids"]


def test_context_limit_is_prompt_plus_max_new_tokens(served):
    url = served[0].url
    ok = {"input_ids": [7] * 500, "sampling_params": {"max_new_tokens": 12, "temperature": 0}}
    status, out = _post(url, ok)  # 500 + 12 == 512: fits exactly
    assert status == 200 and out["meta_info"]["prompt_tokens"] == 500
    status, out = _post(url, ok | {"sampling_params": {"max_new_tokens": 13}})
    assert status == 400 and "context length of 512" in out["error"]["message"]
    batch = {"input_ids": [[1, 2], [3] * 600], "sampling_params": {"max_new_tokens": 2}}
    status, out = _post(url, batch)  # a batch body is rejected whole, naming the prompt
    assert status == 400 and "input_ids[1]" in out["error"]["message"]


def test_hostile_requests_in_the_same_batch_do_not_fail_the_valid_ones(served):
    hostile = [_HOSTILE[k][0](__import__("random").Random(0), 320, 512) for k in HOSTILE_KINDS]
    bodies: list[Any] = [_valid(i) for i in range(40)] + hostile
    got = asyncio.run(_post_many(served[0].url, bodies))
    assert [s for s, _ in got[:40]] == [200] * 40
    assert all(1 <= len(o["output_ids"]) <= 4 for _, o in got[:40])
    assert [s for s, _ in got[40:]] == [400] * len(hostile)


def test_a_batch_failing_inside_the_engine_fails_only_the_culprit(served):
    st, server = served
    splits0, failed0 = server.stats["batch_splits"], server.stats["failed"]
    poisoned = _valid(0) | {"input_ids": [5, PoisonedEngine.POISON, 7]}
    bodies = [_valid(i) for i in range(30)] + [poisoned] + [_valid(i) for i in range(30, 60)]
    got = asyncio.run(_post_many(st.url, bodies))
    statuses = [s for s, _ in got]
    assert statuses[30] == 500 and "injected" in got[30][1]["error"]["message"]
    assert statuses[:30] + statuses[31:] == [200] * 60
    assert server.stats["failed"] == failed0 + 1 and server.stats["batch_splits"] > splits0
    # the same valid request alone gives the same tokens (per-request seeds)
    status, alone = _post(st.url, _valid(3))
    assert status == 200 and alone["output_ids"] == got[3][1]["output_ids"]


def test_text_prompt_is_tokenised_with_the_models_tokenizer(served):
    st, server = served
    status, out = _post(st.url, {"text": "2+2=", "sampling_params": {"max_new_tokens": 4}})
    assert status == 200 and isinstance(out["text"], str) and 1 <= len(out["output_ids"]) <= 4
    tok = server._tokenizer
    assert out["meta_info"]["prompt_tokens"] == len(tok.encode("2+2="))
    assert out["text"] == tok.decode(out["output_ids"], skip_special_tokens=True)
    status, outs = _post(st.url, {"text": ["a", "bc"], "sampling_params": {"max_new_tokens": 2}})
    assert status == 200 and [o["meta_info"]["prompt_tokens"] for o in outs] == [
        len(tok.encode("a")),
        len(tok.encode("bc")),
    ]
    status, out = _post(st.url, {"text": "x", "input_ids": [1, 2]})
    assert status == 400 and "exactly one of 'text' and 'input_ids'" in out["error"]["message"]
    status, out = _post(st.url, {"text": "7" * 5000})
    assert status == 400 and "context length" in out["error"]["message"]


def test_stream_true_answers_as_sglang_streams(served):
    """``stream: true``: server-sent events as SGLang's ``generate_request`` writes them
    (python/sglang/srt/entrypoints/http_server.py): ``data: <output>`` per output, then
    ``data: [DONE]``; the same outputs as without streaming (same seeds)."""
    st, _ = served
    body = {
        **_valid(3),
        "input_ids": [[5, 17, 42], [6, 17]],
        "sampling_params": [
            {"max_new_tokens": 4, "sampling_seed": 1},
            {"max_new_tokens": 4, "sampling_seed": 2},
        ],
    }

    async def raw() -> tuple[int, str, str]:
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{st.url}/generate", json={**body, "stream": True}) as r:
                return r.status, r.headers["Content-Type"], await r.text()

    status, ctype, text = asyncio.run(raw())
    assert status == 200 and ctype.startswith("text/event-stream")
    events = [e.removeprefix("data: ") for e in text.split("\n\n") if e]
    assert events[-1] == "[DONE]" and all(e.startswith("{") for e in events[:-1])
    streamed = [json.loads(e) for e in events[:-1]]
    status, plain = _post(st.url, body)
    assert status == 200 and len(streamed) == 2
    for a, b in zip(streamed, plain, strict=True):
        assert a["output_ids"] == b["output_ids"] and a["meta_info"]["finish_reason"]
        assert a["meta_info"]["output_token_logprobs"] == b["meta_info"]["output_token_logprobs"]


def test_in_process_engine_names_the_bad_request():
    params = SamplingParams(max_tokens=8)
    good = GenRequest([1, 2, 3], params)
    with pytest.raises(ValueError, match=r"request 1 \(tag='x'\): the input \(600 tokens\)"):
        check_requests([good, GenRequest([1] * 600, params, tag="x")], 320, 512)
    with pytest.raises(ValueError, match="request 0 .*exceeds the model's context length of 512"):
        check_requests([GenRequest([1] * 505, params)], 320, 512)
    with pytest.raises(ValueError, match="temperature must be a finite number"):
        check_requests([GenRequest([1], SamplingParams(temperature=math.nan))], 320, 512)
    engine = HFEngine(RolloutConfig(engine="hf"), str(MODEL), seed=0)
    assert (engine.vocab_size, engine.context_len) == (320, 512)
    with pytest.raises(ValueError, match="outside \\[0, 320\\)"):
        engine.generate([good, GenRequest([1, 320], params)])
