"""`megatron-rl serve` under hostile load: 2,000 requests, concurrency 200, 5% hostile.

Real components only: the server is the `megatron-rl serve --engine hf` process on the shipped
models/tiny-base (context 512, vocabulary 320), the load is real HTTP on 127.0.0.1
(tests/integration/serve_load.py builds every body up front, seeded). Checked: every valid request
gets 200 with the right shape, every hostile one a 4xx naming its field, /health is 200 afterwards
and the server's resident memory stays bounded.

Memory bound, and why 256 MiB: RSS is read after a warm-up (one full batch of 200 valid
requests, so the engine's working set and the allocator's arenas exist) and again after the
run. What the run may add on top: at most 200 bodies in flight, of which the largest (the
200,000-token prompts) are ~1.2 MB of JSON and ~1.6 MB parsed, rejected before any tensor is
made; a batch's KV cache (256 rows x ~70 positions x 4 layers x 2 x 64 floats) is ~37 MB and
already in the warm-up. Measured growth was ~20 MB (docs/LOG.md); 256 MiB is far above that,
and far below what one over-long prompt reaching the engine would allocate (the 40 GB of the
issue), or what keeping every request's state would cost.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from serve_load import make_requests, run_load

from launch.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "tiny-base"
RSS_GROWTH_MIB = 256


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _health(url: str) -> int:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
            return int(r.status)
    except OSError:
        return 0


def _start_server(port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "launch.cli", "serve", "--model", str(MODEL)]
    cmd += ["--engine", "hf", "--port", str(port)]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def test_hostile_load_fails_only_the_hostile_requests(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    proc = _start_server(port, log)
    try:
        deadline = time.monotonic() + 120
        while _health(url) != 200:
            assert proc.poll() is None, log.read_text()[-2000:]
            assert time.monotonic() < deadline, "server not healthy in 120 s"
            time.sleep(0.5)
        warm = asyncio.run(run_load(url, make_requests(200, 0.0, 320, 512, seed=1), 200))
        assert not warm.failures, warm.failures[:5]
        rss_warm = _rss_mib(proc.pid)

        reqs = make_requests(2000, 0.05, 320, 512, seed=0)
        assert sum(r.kind != "valid" for r in reqs) == 100
        res = asyncio.run(run_load(url, reqs, concurrency=200))
        print("hostile load:", res.summary(), res.statuses)  # recorded in docs/LOG.md

        assert not res.failures, res.failures[:10]
        assert sum(res.statuses.values()) == 2000
        assert (
            res.statuses.get(200) == 1900
            and sum(n for s, n in res.statuses.items() if 400 <= s < 500) == 100
        )
        assert _health(url) == 200 and proc.poll() is None
        rss_after = _rss_mib(proc.pid)
        print(f"server RSS: {rss_warm:.0f} MiB after warm-up, {rss_after:.0f} MiB after the run")
        assert rss_after - rss_warm < RSS_GROWTH_MIB, (rss_warm, rss_after)
    finally:
        proc.terminate()
        proc.wait(30)
