"""Tracking: metrics.jsonl always, real W&B in offline mode, resume continues the same run."""

from __future__ import annotations

import json

from megatron_rl.tracking.config import TrackingConfig
from megatron_rl.tracking.tracker import Tracker


def _rows(path):
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_jsonl_and_offline_wandb_resume(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc: auto -> offline
    cfg = TrackingConfig(wandb="auto", project="t")
    tr = Tracker(cfg, tmp_path / "run", {"a": 1})
    for step in range(4):
        tr.log(step, {"loss": 1.0 / (step + 1), "nan": float("nan")})
    tr.event(2, "regression", domain="x")
    tr.table(3, "samples", ["domain", "reward"], [["x", 1.0]])
    tr.finish()
    run_id = (tmp_path / "run" / "wandb_id.txt").read_text()
    offline = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert offline, "W&B offline run directory missing"
    rows = _rows(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2, 3] and rows[0]["nan"] == "nan"
    # resume after step 1: later rows dropped, same W&B id
    tr2 = Tracker(cfg, tmp_path / "run", {"a": 1}, resume_step=1)
    tr2.log(2, {"loss": 0.1})
    tr2.finish()
    assert [r["step"] for r in _rows(tmp_path / "run" / "metrics.jsonl")] == [0, 1, 2]
    assert _rows(tmp_path / "run" / "events.jsonl") == []
    assert (tmp_path / "run" / "wandb_id.txt").read_text() == run_id


def test_disabled_rank_writes_nothing(tmp_path) -> None:
    tr = Tracker(TrackingConfig(wandb="disabled"), tmp_path / "r", {}, enabled=False)
    tr.log(0, {"x": 1.0})
    assert not (tmp_path / "r").exists()
