"""``rewards.judge.engine: sglang`` (megatron_rl/rewards/judge_client.py) against the embedded
SGLang-compatible server (megatron_rl/rollout/server.py, on loopback in a thread of this
process) running the ``hf`` engine on a random tiny Qwen2: verdicts come back through the real
HTTP client with the API key, and nothing is pushed to or written beside the judge model; a
judge server that refuses connections or never answers is counted within the deadline and
backed off from.

The server checks ``Authorization: Bearer <key>`` (``EmbeddedServer(api_key=...)``: 401 except
``GET /health``, SGLang's ``--api-key`` rule). One test serves a scripted engine
(it answers "7" to every prompt) instead of the model, to see a parsed score: a random model's
verdict is never a number.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from aiohttp import web
from test_sglang import ServerThread

from benchmarks.tiny_model import make_tiny_qwen2
from megatron_rl.domains.base import Task
from megatron_rl.rewards.judge import Judge, JudgeConfig
from megatron_rl.rollout.auth import API_KEY_ENV
from megatron_rl.rollout.base import Completion, GenRequest, RolloutEngine
from megatron_rl.rollout.config import RolloutConfig
from megatron_rl.rollout.hf_engine import HFEngine
from megatron_rl.rollout.server import EmbeddedServer

torch.set_num_threads(1)
KEY = "judge-test-key-0123456789abcdefghijkl"  # 37 printable characters
TASKS = [Task("d/x", "train", i, f"id{i}", f"What is {i} + {i}?", str(2 * i)) for i in range(4)]
ITEMS = [(t, f"{i}") for i, t in enumerate(TASKS)]


class Scripted(RolloutEngine):
    """A judge model that answers "7" to every prompt (see the module docstring)."""

    vocab_size = 300

    def generate(self, requests: list[GenRequest]) -> list[list[Completion]]:
        return [[Completion([55], "7", [-0.1], "stop")] * r.params.n for r in requests]

    def update_weights(self, hf_state_dict: Any) -> float:
        raise AssertionError("a judge must never push weights")

    def update_weights_from_disk(self, hf_dir: str) -> float:
        raise AssertionError("a judge must never push weights")


@pytest.fixture(scope="module")
def judge_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_qwen2(tmp_path_factory.mktemp("judge") / "model", seed=0)


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(API_KEY_ENV, KEY)
    return KEY


def serve(engine: RolloutEngine, model: Path) -> tuple[ServerThread, EmbeddedServer]:
    server = EmbeddedServer(engine, str(model), api_key=KEY)
    return ServerThread(server), server


def sglang_judge(model: Path, urls: list[str], **cfg: Any) -> Judge:
    jc = JudgeConfig(model=str(model), engine="sglang", urls=urls, domains=["d/*"], **cfg)
    jc.validate()
    return Judge(jc, seed=0)


def dead_url() -> str:
    with socket.socket() as s:  # a port nothing listens on once it is closed
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_an_sglang_judge_scores_through_the_server_like_the_same_model_locally(
    judge_model, key
) -> None:
    before = sorted(p.name for p in judge_model.parent.rglob("*"))
    hf = RolloutConfig(engine="hf", max_new_tokens=8)
    st, server = serve(HFEngine(hf, str(judge_model), seed=0), judge_model)
    remote = sglang_judge(judge_model, [st.url], max_tokens=8)
    local_engine = HFEngine(hf, str(judge_model), seed=0)
    local = Judge(
        JudgeConfig(model=str(judge_model), domains=["d/*"], max_tokens=8), 0, lambda: local_engine
    )
    try:
        got = remote.score(ITEMS)
        assert got == local.score(ITEMS)  # the same greedy verdicts, parsed the same way
        assert not {"dead", "timeout"} & {x for x in got if isinstance(x, str)}
        assert remote.scored + remote.failures["empty"] + remote.failures["unparsable"] == 4
        assert remote.score(ITEMS[:1]) == got[:1]  # the same client, a second batch
        stats = server.stats
        assert stats["requests"] == 5 and stats["weight_updates"] == 0
    finally:
        remote.close()
        st.close()
    # nothing written beside the judge model (no rollout_weights/, no current_weights.json)
    assert sorted(p.name for p in judge_model.parent.rglob("*")) == before


def test_an_sglang_judge_parses_the_servers_verdicts_and_fails_over(judge_model, key) -> None:
    st, _ = serve(Scripted(), judge_model)
    j = sglang_judge(judge_model, [dead_url(), st.url])  # the first that answers is used
    try:
        assert j.score(ITEMS) == [pytest.approx(0.7)] * 4
        assert j.metrics()["judge/scored"] == 4 and j.metrics()["judge/failures/dead"] == 0
    finally:
        j.close()
        st.close()


def test_the_key_comes_from_the_key_file_and_a_wrong_key_is_dead(
    judge_model, tmp_path, monkeypatch
) -> None:
    st, _ = serve(Scripted(), judge_model)
    key_file = tmp_path / "judge_key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    try:
        by_file = sglang_judge(judge_model, [st.url], api_key_file=str(key_file))
        assert by_file.score(ITEMS[:2]) == [pytest.approx(0.7)] * 2
        by_file.close()
        monkeypatch.setenv(API_KEY_ENV, "a-wrong-key-" + "x" * 24)
        wrong = sglang_judge(judge_model, [st.url], api_key_file=str(key_file))
        t0 = time.monotonic()
        assert wrong.score(ITEMS[:2]) == ["dead", "dead"]  # the environment's key wins
        assert time.monotonic() - t0 < 5 and wrong.metrics()["judge/start_failures"] == 1
        monkeypatch.delenv(API_KEY_ENV)
        none = sglang_judge(judge_model, [st.url])
        assert none.score(ITEMS[:1]) == ["dead"]  # no key at all
        wrong.close()
        none.close()
    finally:
        st.close()


def test_a_judge_server_nobody_runs_is_dead_within_the_deadline(judge_model, key) -> None:
    j = sglang_judge(judge_model, [dead_url()], timeout_s=10.0)
    t0 = time.monotonic()
    assert j.score(ITEMS) == ["dead"] * 4
    assert time.monotonic() - t0 < 3.0  # a refused connection is not waited out
    t0 = time.monotonic()
    assert j.score(ITEMS) == ["dead"] * 4  # backing off: not even tried
    assert time.monotonic() - t0 < 0.1
    m = j.metrics()
    assert m["judge/failures/dead"] == 8 and m["judge/start_failures"] == 1
    assert m["judge/start_skipped"] == 1


def test_a_judge_server_that_never_answers_is_a_timeout_within_the_deadline(
    judge_model, key
) -> None:
    with socket.socket() as silent:  # accepts connections (the kernel does), answers nothing
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        j = sglang_judge(
            judge_model, [f"http://127.0.0.1:{silent.getsockname()[1]}"], timeout_s=1.0
        )
        t0 = time.monotonic()
        assert j.score(ITEMS) == ["timeout"] * 4
        assert time.monotonic() - t0 < 2.0
        t0 = time.monotonic()
        assert j.score(ITEMS) == ["dead"] * 4 and time.monotonic() - t0 < 0.1  # backing off
        assert j.metrics()["judge/start_failures"] == 1
        j.close()


class Faulty:
    """A judge server whose /health and /get_model_info answer, and whose /generate misbehaves
    as ``mode`` says: hangs, answers what is not SGLang's schema, or refuses the key."""

    def __init__(self, mode: str) -> None:
        self.mode, self.generates = mode, 0
        self.release = threading.Event()  # ends the hanging answers (the server can then stop)

    def app(self) -> web.Application:
        async def ok(request: web.Request) -> web.Response:
            return web.json_response({"model_path": "judge"})

        async def generate(request: web.Request) -> web.Response:
            self.generates += 1
            while self.mode == "hang" and not self.release.is_set():
                await asyncio.sleep(0.05)
            if self.mode == "unauthorized":
                return web.Response(status=401, text="invalid API key")
            return web.json_response({"text": "7"})  # no output_ids, no meta_info

        app = web.Application()
        app.router.add_get("/health", ok)
        app.router.add_get("/get_model_info", ok)
        app.router.add_post("/generate", generate)
        return app


@pytest.mark.parametrize(
    ("mode", "kind"), [("hang", "timeout"), ("schema", "dead"), ("unauthorized", "dead")]
)
def test_a_judge_server_that_fails_its_requests_is_counted_and_started_again(
    judge_model, key, mode, kind
) -> None:
    fault = Faulty(mode)
    st = ServerThread(fault)  # type: ignore[arg-type]
    j = sglang_judge(judge_model, [st.url], timeout_s=1.5)
    try:
        for _ in range(2):  # the server answers its health check: no back-off
            t0 = time.monotonic()
            assert j.score(ITEMS) == [kind] * 4
            assert time.monotonic() - t0 < 2.5
        assert fault.generates >= 8 and j.failures[kind] == 8
        assert j.metrics()["judge/start_failures"] == 0
    finally:
        j.close()
        fault.release.set()
        st.close()
