"""A local fleet refuses strangers: `megatron-rl serve --num-servers 2` behind the real
sglang-router, started without ``$MEGATRON_RL_API_KEY`` so the fleet makes its own key file.

Every state-changing, weight and generation request without the key (or with a wrong one) is
refused with 401/403, on the servers and on the router; with the key the fleet serves; nothing
of it listens on 0.0.0.0; the manifest does not show the key; a weight-update group led by
anyone but the trainer is refused even with the key; the trainer's client finds the key in the
run directory. The router's behaviour is sglang-router 0.3.2's own (``--api-key``: its auth
middleware guards /generate, /workers and /flush_cache; /health, /liveness and the info routes
stay open, as its ``server.rs`` routes them).
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from launch.servers import free_port, http
from megatron_rl.rollout.auth import API_KEY_ENV
from megatron_rl.rollout.base import GenRequest, SamplingParams
from megatron_rl.rollout.config import RolloutConfig, SGLangConfig
from megatron_rl.rollout.sglang_client import SGLangEngine

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "tiny-base"
GEN = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
# (method, path, body): everything that changes state, moves weights or generates
GUARDED = [
    ("POST", "/generate", GEN),
    ("POST", "/update_weights_from_disk", {"model_path": str(MODEL)}),
    ("POST", "/get_weights_by_name", {"name": "model.embed_tokens.weight", "truncate_size": 1}),
    (
        "POST",
        "/init_weights_update_group",
        {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1, "world_size": 2},
    ),
    ("POST", "/update_weights_from_distributed", {"names": [], "dtypes": [], "shapes": []}),
    ("POST", "/destroy_weights_update_group", {"group_name": "weight_update_group"}),
    ("POST", "/abort_request", {"rid": "", "abort_all": True}),
    ("POST", "/flush_cache", None),
    ("GET", "/health_generate", None),
    ("GET", "/get_server_info", None),
]
ROUTER_GUARDED = [
    ("POST", "/generate", GEN),
    ("POST", "/workers", {"url": "http://127.0.0.1:9"}),
    ("GET", "/workers", None),
    ("DELETE", "/workers/any", None),
    ("POST", "/flush_cache", None),
]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Any:
    run = tmp_path_factory.mktemp("fleet") / "run"
    env = {k: v for k, v in os.environ.items() if k != API_KEY_ENV}  # the fleet makes its key
    env |= {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    router_port = free_port()
    cmd = [sys.executable, "-m", "launch.cli", "serve", "--model", str(MODEL), "--engine", "hf"]
    cmd += ["--num-servers", "2", "--router-port", str(router_port), "--run-dir", str(run)]
    log = (run.parent / "fleet.log").open("wb")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        while not list(run.glob("servers-*.json")):
            assert proc.poll() is None, (run.parent / "fleet.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the fleet did not come up"
            time.sleep(0.5)
        manifest = json.loads(next(run.glob("servers-*.json")).read_text())
        yield run, manifest, proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def _urls(manifest: dict[str, Any], role: str) -> list[str]:
    return [f"http://{p['host']}:{p['port']}" for p in manifest["processes"] if p["role"] == role]


def test_the_fleet_makes_a_private_key_and_never_shows_it(fleet: Any) -> None:
    run, manifest, _ = fleet
    key_file = run / "api_key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    key = key_file.read_text().strip()
    assert len(key) >= 32
    text = next(run.glob("servers-*.json")).read_text()
    assert key not in text and "<api key>" in text  # the router's --api-key is blanked


@pytest.mark.parametrize("sent", ["", "wrong-key-of-enough-length-0123456789"])
def test_servers_and_router_refuse_every_guarded_request_without_the_key(
    fleet: Any, sent: str
) -> None:
    _, manifest, _ = fleet
    for url in _urls(manifest, "server"):
        for method, path, body in GUARDED:
            status, text = http(method, url + path, body, timeout=30, key=sent)
            assert status in (401, 403), (url, path, status, text[:200])
    for url in _urls(manifest, "router"):
        for method, path, body in ROUTER_GUARDED:
            status, text = http(method, url + path, body, timeout=30, key=sent)
            assert status in (401, 403), (url, path, status, text[:200])
        assert http("GET", url + "/workers", key=sent)[0] == 401  # nothing was registered


def test_with_the_key_the_fleet_serves(fleet: Any) -> None:
    run, manifest, _ = fleet
    key = (run / "api_key").read_text().strip()
    for url in _urls(manifest, "server") + _urls(manifest, "router"):
        status, text = http("POST", url + "/generate", GEN, timeout=60, key=key)
        assert status == 200, (url, text[:300])
        assert 1 <= len(json.loads(text)["output_ids"]) <= 2  # max_new_tokens 2 (EOS may stop it)
    assert http("GET", _urls(manifest, "server")[0] + "/health", key="")[0] == 200  # liveness
    router = _urls(manifest, "router")[0]
    workers = json.loads(http("GET", router + "/workers", key=key)[1])["workers"]
    assert sorted(w["url"].rstrip("/") for w in workers) == sorted(_urls(manifest, "server"))


def test_a_weight_group_led_by_anyone_but_the_trainer_is_refused(fleet: Any) -> None:
    run, manifest, _ = fleet
    key = (run / "api_key").read_text().strip()
    body = {"master_address": "192.0.2.1", "master_port": 29999, "rank_offset": 1}
    body |= {"world_size": 2}  # 192.0.2.1: TEST-NET-1, never this host
    for url in _urls(manifest, "server"):
        status, text = http("POST", url + "/init_weights_update_group", body, 30, key=key)
        assert status == 403 and "master_address" in text, text[:300]


def test_nothing_of_the_fleet_listens_on_every_interface(fleet: Any) -> None:
    _, _, proc = fleet
    family = psutil.Process(proc.pid)
    pids = {proc.pid} | {c.pid for c in family.children(recursive=True)}
    listening = [
        c
        for c in psutil.net_connections("inet")
        if c.status == psutil.CONN_LISTEN and c.pid in pids
    ]
    assert len(listening) >= 4, listening  # 2 servers, the router and its metrics port
    assert all(c.laddr.ip in ("127.0.0.1", "::1") for c in listening), listening


def test_the_trainers_client_finds_the_key_in_the_run_dir(
    fleet: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, manifest, _ = fleet
    monkeypatch.delenv(API_KEY_ENV)
    cfg = RolloutConfig(
        engine="sglang",
        urls=_urls(manifest, "router"),
        sync_dir=str(run / "rollout_weights"),
        sglang=SGLangConfig(max_retries=0),
    )
    client = SGLangEngine(cfg, str(run / "engine_weights"), seed=0)
    try:
        out = client.generate([GenRequest([5, 6, 7], SamplingParams(max_tokens=2, n=2))])
    finally:
        client.shutdown()
    assert len(out[0]) == 2  # both samples, generated (one may stop at EOS after one token)
    assert all(c.finish_reason != "abort" and 1 <= len(c.token_ids) <= 2 for c in out[0])
    # without any key the client says where one comes from
    other = run.parent / "elsewhere"
    cfg.sync_dir = str(other / "rollout_weights")
    with pytest.raises(ValueError, match="MEGATRON_RL_API_KEY"):
        SGLangEngine(cfg, str(other / "engine_weights"), seed=0)
