"""Hostile load on an SGLang-API server: valid requests mixed with bad ones, on loopback.

Used by tests/integration/test_server_load.py (``make test``) and runnable by hand against any
server:

    python tests/integration/serve_load.py http://127.0.0.1:PORT --requests 2000 --concurrency 200

Every body is built up front (seeded); each hostile kind names the field its 4xx must mention.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from megatron_rl.rollout.auth import bearer, env_key

# kind -> (body maker, text the error message must contain)
_HOSTILE: dict[str, tuple[Any, str]] = {
    "over_long": (lambda r, v, c: {"input_ids": [r.randrange(v)] * 200_000}, "context length"),
    "prompt_plus_new_over_context": (
        lambda r, v, c: {"input_ids": [1] * (c - 8), "sampling_params": {"max_new_tokens": 64}},
        "context length",
    ),
    "not_json": (lambda r, v, c: b'{"input_ids": [1, 2,', "not valid JSON"),
    "ids_not_ints": (lambda r, v, c: {"input_ids": ["a", "b"]}, "input_ids"),
    "no_prompt": (lambda r, v, c: {"sampling_params": {"max_new_tokens": 4}}, "input_ids"),
    "body_not_object": (lambda r, v, c: [1, 2, 3], "object"),
    "empty_prompt": (lambda r, v, c: {"input_ids": []}, "input_ids"),
    "token_out_of_range": (lambda r, v, c: {"input_ids": [1, v + 7, 2]}, "input_ids"),
    "negative_token": (lambda r, v, c: {"input_ids": [1, -1]}, "input_ids"),
    "negative_temperature": (lambda r, v, c: _sp(temperature=-0.5), "temperature"),
    "nan_temperature": (lambda r, v, c: _sp(temperature=float("nan")), "temperature"),
    "top_p_zero": (lambda r, v, c: _sp(top_p=0.0), "top_p"),
    "top_p_above_one": (lambda r, v, c: _sp(top_p=1.5), "top_p"),
    "negative_max_new_tokens": (lambda r, v, c: _sp(max_new_tokens=-3), "max_new_tokens"),
    "huge_n": (lambda r, v, c: _sp(n=1_000_000), "n"),
    "huge_seed": (lambda r, v, c: _sp(sampling_seed=2**70), "sampling_seed"),
    "unknown_field": (lambda r, v, c: {"input_ids": [1, 2], "bogus_field": 1}, "bogus_field"),
    "unknown_sampling_field": (lambda r, v, c: _sp(max_tokens=4), "max_tokens"),
    "string_temperature": (lambda r, v, c: _sp(temperature="hot"), "temperature"),
    "huge_int_temperature": (lambda r, v, c: _sp(temperature=10**400), "temperature"),
    "stop_token_out_of_range": (lambda r, v, c: _sp(stop_token_ids=[v]), "stop_token_ids"),
    "deep_json": (lambda r, v, c: b'{"input_ids": ' + b"[" * 100_000, "not valid JSON"),
    "empty_body": (lambda r, v, c: b"", "not valid JSON"),
    "null_body": (lambda r, v, c: None, "object"),
    "text_and_ids": (lambda r, v, c: {"text": "hi", "input_ids": [1]}, "exactly one of"),
    "text_over_long": (lambda r, v, c: {"text": "7" * (4 * c)}, "context length"),
    "sampling_params_count": (
        lambda r, v, c: {"input_ids": [[1, 2], [3]], "sampling_params": [{}]},
        "sampling_params",
    ),
}
HOSTILE_KINDS = sorted(_HOSTILE)


def _sp(**sp: Any) -> dict[str, Any]:
    return {"input_ids": [3, 4, 5, 6, 7], "sampling_params": sp}


@dataclass
class Request:
    kind: str  # "valid" or a hostile kind
    body: bytes
    prompt_len: int = 0  # valid only
    max_new: int = 0  # valid only
    must_mention: str = ""  # hostile only


def make_requests(
    n: int, hostile_frac: float, vocab: int, context_len: int, seed: int = 0
) -> list[Request]:
    """``n`` requests, ``round(n * hostile_frac)`` of them hostile (kinds in turn), shuffled."""
    rng = random.Random(seed)
    n_bad = round(n * hostile_frac)
    out = []
    for i in range(n_bad):
        kind = HOSTILE_KINDS[i % len(HOSTILE_KINDS)]
        make, mention = _HOSTILE[kind]
        body = make(rng, vocab, context_len)
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        out.append(Request(kind, raw, must_mention=mention))
    for _ in range(n - n_bad):
        plen, max_new = rng.randint(5, 60), rng.randint(1, 8)
        sp = {
            "max_new_tokens": max_new,
            "temperature": rng.choice([0.0, 0.7, 1.0]),
            "top_p": rng.choice([1.0, 0.9]),
            "sampling_seed": rng.randrange(2**31),
        }
        body = {"input_ids": [rng.randrange(vocab) for _ in range(plen)], "sampling_params": sp}
        body["return_logprob"] = True
        out.append(Request("valid", json.dumps(body).encode(), plen, max_new))
    rng.shuffle(out)
    return out


@dataclass
class LoadResult:
    wall_s: float
    latencies: dict[str, list[float]] = field(default_factory=dict)  # kind -> seconds
    failures: list[str] = field(default_factory=list)  # what went wrong, one line each
    statuses: dict[int, int] = field(default_factory=dict)  # HTTP status -> count

    def percentile(self, q: float, kind: str = "valid") -> float:
        xs = sorted(self.latencies.get(kind, []))
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")

    def summary(self) -> dict[str, float]:
        total = sum(len(v) for v in self.latencies.values())
        return {
            "requests": total,
            "wall_s": round(self.wall_s, 2),
            "req_per_s": round(total / self.wall_s, 1),
            "valid_p50_ms": round(1000 * self.percentile(0.5), 1),
            "valid_p99_ms": round(1000 * self.percentile(0.99), 1),
            "hostile_p99_ms": round(
                1000 * max((self.percentile(0.99, k) for k in HOSTILE_KINDS), default=0), 1
            ),
        }


def _check(req: Request, status: int, text: str) -> str | None:
    """None if the answer is right for the request, else what is wrong."""
    if req.kind != "valid":
        if not 400 <= status < 500:
            return f"{req.kind}: status {status}, want 4xx: {text[:200]}"
        if req.must_mention not in text:
            return f"{req.kind}: error does not mention {req.must_mention!r}: {text[:200]}"
        return None
    if status != 200:
        return f"valid request: status {status}: {text[:200]}"
    out = json.loads(text)
    meta = out["meta_info"]
    if meta["prompt_tokens"] != req.prompt_len or not 1 <= len(out["output_ids"]) <= req.max_new:
        return f"valid request: wrong shape {meta}"
    if len(meta["output_token_logprobs"]) != len(out["output_ids"]):
        return "valid request: log-probs do not match the tokens"
    return None


async def run_load(url: str, requests: list[Request], concurrency: int) -> LoadResult:
    """Send every request with at most ``concurrency`` in flight; check every answer."""
    sem = asyncio.Semaphore(concurrency)
    res = LoadResult(wall_s=0.0)
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=300)
    headers = {"Content-Type": "application/json", **bearer(env_key())}  # the fleet's API key

    async def one(session: aiohttp.ClientSession, req: Request) -> None:
        async with sem:
            t0 = time.perf_counter()
            async with session.post(f"{url}/generate", data=req.body, headers=headers) as r:
                text = await r.text()
                status = r.status
            res.latencies.setdefault(req.kind, []).append(time.perf_counter() - t0)
        res.statuses[status] = res.statuses.get(status, 0) + 1
        problem = _check(req, status, text)
        if problem:
            res.failures.append(problem)

    t0 = time.perf_counter()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(one(session, r) for r in requests))
    res.wall_s = time.perf_counter() - t0
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("url")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=200)
    p.add_argument("--hostile", type=float, default=0.05)
    p.add_argument("--vocab", type=int, default=320)
    p.add_argument("--context", type=int, default=512)
    a = p.parse_args()
    reqs = make_requests(a.requests, a.hostile, a.vocab, a.context)
    res = asyncio.run(run_load(a.url.rstrip("/"), reqs, a.concurrency))
    print(json.dumps({**res.summary(), "statuses": res.statuses, "failures": res.failures[:10]}))


if __name__ == "__main__":
    main()
