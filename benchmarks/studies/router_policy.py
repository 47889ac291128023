"""sglang-router policy for GRPO rollouts: ``cache_aware`` vs ``round_robin``, on embedded servers.

One step of generation as the trainer sends it (every sample its own ``/generate`` request,
``prompts`` groups of ``group`` samples sharing a long prompt) through the real sglang-router to
two embedded ``hf`` servers (in this process, so each request's server is known). Both routers
front the same two servers; the policies alternate step by step (A, B, A, B...) so that load on
the machine hits both alike. Printed per policy: step wall time, the share of groups whose
samples all landed on one server (a group's prompt is then prefilled once, not once per
server: the engine shares a prompt's KV cache within a batch), and the request split between
the servers. The ratio of step times is what carries over; absolute times do not.

    python -m benchmarks.studies.router_policy [--reps 4] [--prompt-len 512] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from benchmarks.tiny_model import make_tiny_qwen2
from launch.servers import Fleet, Proc, free_port
from megatron_rl.rollout.auth import API_KEY_ENV
from megatron_rl.rollout.base import GenRequest, SamplingParams
from megatron_rl.rollout.config import RolloutConfig, SGLangConfig
from megatron_rl.rollout.hf_engine import HFEngine
from megatron_rl.rollout.server import EmbeddedServer
from megatron_rl.rollout.sglang_client import SGLangEngine

POLICIES = ("round_robin", "cache_aware")


class Recording(EmbeddedServer):
    """An embedded server that remembers the rid of every request it was given."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.rids: list[str] = []
        self.batcher.submit = self._record(self.batcher.submit)  # type: ignore[method-assign]

    def _record(self, submit: Any) -> Any:
        async def recording(rid: str, req: GenRequest) -> Any:
            if not rid.startswith("HEALTH_CHECK"):  # the routers' own checks are not the step's
                self.rids.append(rid)
            return await submit(rid, req)

        return recording


def _serve(server: EmbeddedServer) -> tuple[str, Any]:
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    runner = web.AppRunner(server.app(), access_log=None)
    asyncio.run_coroutine_threadsafe(runner.setup(), loop).result()
    asyncio.run_coroutine_threadsafe(web.TCPSite(runner, "127.0.0.1", 0).start(), loop).result()
    return f"http://127.0.0.1:{runner.addresses[0][1]}", (runner, loop)


def _step(engine: SGLangEngine, servers: list[Recording], args: argparse.Namespace, k: int) -> dict:
    reqs = [
        GenRequest([(31 * k + 7 * i + j) % 250 + 5 for j in range(args.prompt_len)],
                   SamplingParams(max_tokens=args.new_tokens, n=args.group))
        for i in range(args.prompts)
    ]  # fmt: skip
    for s in servers:
        s.rids.clear()
    t0 = time.perf_counter()
    engine.generate(reqs)
    wall = time.perf_counter() - t0
    where: dict[str, set[int]] = {}
    for idx, s in enumerate(servers):
        for rid in s.rids:
            where.setdefault(rid.rsplit("-", 1)[0], set()).add(idx)  # rid = call-i-j
    one = sum(len(v) == 1 for v in where.values()) / max(1, len(where))
    return {"wall_s": wall, "groups_on_one_server": one,
            "requests": [len(s.rids) for s in servers]}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=4, help="steps per policy (alternating)")
    p.add_argument("--prompts", type=int, default=8, help="groups per step")
    p.add_argument("--group", type=int, default=8, help="samples per group")
    p.add_argument("--prompt-len", type=int, default=512, help="prompt tokens")
    p.add_argument("--new-tokens", type=int, default=8, help="generated tokens per sample")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="router-policy-"))
    model = make_tiny_qwen2(tmp / "m", "3m", seed=0)
    key = os.environ.setdefault(API_KEY_ENV, secrets.token_urlsafe(32))  # routers and client
    servers = [Recording(HFEngine(RolloutConfig(engine="hf"), str(model), seed=s), str(model),
                         api_key=key) for s in (0, 1)]  # fmt: skip
    urls = [_serve(s)[0] for s in servers]
    routers = {pol: Fleet(tmp / pol, "", 0, engine="hf", router_port=free_port(),
                          router_policy=pol, health_timeout_s=60) for pol in POLICIES}  # fmt: skip
    results: dict[str, list[dict]] = {pol: [] for pol in POLICIES}
    try:
        engines = {}
        for pol, fleet in routers.items():
            fleet.start()
            for u in urls:
                port = int(u.rsplit(":", 1)[1])
                fleet.register(Proc(f"s{port}", "server", "127.0.0.1", port, [], ""))
            sg = SGLangConfig(max_concurrency=256)
            cfg = RolloutConfig(engine="sglang", urls=[str(fleet.router_url)], sync_dir=str(tmp),
                                request_timeout_s=600, sglang=sg)  # fmt: skip
            engines[pol] = SGLangEngine(cfg, str(tmp / "none"), seed=0)
        for k in range(args.reps + 1):  # step 0 of each: warm-up, not counted
            for pol in POLICIES if k % 2 == 0 else POLICIES[::-1]:
                r = _step(engines[pol], servers, args, k)
                if k:
                    results[pol].append(r)
                print(pol, k, json.dumps(r), flush=True)
    finally:
        for e in locals().get("engines", {}).values():
            e.shutdown()
        for f in routers.values():
            f.stop()
    summary = {pol: {"wall_s_mean": statistics.mean(r["wall_s"] for r in rs),
                     "groups_on_one_server": statistics.mean(r["groups_on_one_server"] for r in rs),
                     "requests": [sum(r["requests"][i] for r in rs) for i in range(2)]}
               for pol, rs in results.items()}  # fmt: skip
    ratios = [a["wall_s"] / b["wall_s"] for a, b in zip(results["cache_aware"],
              results["round_robin"], strict=True)]  # fmt: skip
    summary["ratio_cache_aware_over_round_robin"] = {
        "mean": statistics.mean(ratios), "per_rep": ratios,
        "stdev": statistics.stdev(ratios) if len(ratios) > 1 else 0.0,
    }  # fmt: skip
    summary["load_avg"] = os.getloadavg()[0]
    summary["args"] = vars(args)
    print(json.dumps(summary, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
