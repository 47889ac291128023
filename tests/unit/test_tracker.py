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


def _torn_run(tmp_path, tail: str):
    """A run's logs with three steps and ``tail`` appended to metrics.jsonl as the last line."""
    run = tmp_path / "run"
    tr = Tracker(TrackingConfig(wandb="disabled"), run, {})
    for step in range(3):
        tr.log(step, {"loss": 1.0})
    tr.event(1, "regression", domain="x")
    tr.finish()
    with (run / "metrics.jsonl").open("a") as f:
        f.write(tail)
    return run


def test_a_torn_last_line_is_dropped_with_one_warning_and_the_run_resumes(tmp_path, caplog) -> None:
    import logging

    run = _torn_run(tmp_path, '{"step": 3, "loss": 0.')  # a kill in the middle of an append
    with caplog.at_level(logging.WARNING):
        tr = Tracker(TrackingConfig(wandb="disabled"), run, {}, resume_step=2)
    torn = [r for r in caplog.records if "torn last line" in r.getMessage()]
    assert len(torn) == 1 and "line 4" in torn[0].getMessage()
    tr.log(3, {"loss": 0.5})
    tr.finish()
    assert [r["step"] for r in _rows(run / "metrics.jsonl")] == [0, 1, 2, 3]
    assert [r["step"] for r in _rows(run / "events.jsonl")] == [1]
    assert not [p for p in run.iterdir() if p.name.endswith(".tmp")]  # no temp file left


def test_a_complete_last_row_without_its_newline_is_kept(tmp_path) -> None:
    run = _torn_run(tmp_path, '{"step": 2, "extra": 1}')
    Tracker(TrackingConfig(wandb="disabled"), run, {}, resume_step=2).finish()
    rows = _rows(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2, 2] and rows[-1]["extra"] == 1
    assert (run / "metrics.jsonl").read_text().endswith("\n")


def test_a_bad_line_in_the_middle_is_an_error_naming_it_and_nothing_is_written(tmp_path) -> None:
    import pytest

    run = _torn_run(tmp_path, '{"step": 2, "loss": 2.0}\n')
    lines = (run / "metrics.jsonl").read_text().splitlines()
    lines[1] = lines[1][:7]  # damage inside the file, not a torn append
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in run.iterdir()}
    with pytest.raises(ValueError, match=r"metrics.jsonl line 2 is not a JSON object"):
        Tracker(TrackingConfig(wandb="disabled"), run, {}, resume_step=1)
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in run.iterdir()} == before


def test_a_resume_that_changes_nothing_rewrites_nothing(tmp_path) -> None:
    run = _torn_run(tmp_path, "")
    before = {p.name: p.stat().st_mtime_ns for p in run.iterdir()}
    Tracker(TrackingConfig(wandb="disabled"), run, {}, resume_step=5).finish()
    assert {p.name: p.stat().st_mtime_ns for p in run.iterdir()} == before
