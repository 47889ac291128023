"""Metrics to W&B and to ``metrics.jsonl``; the console gets a progress bar.

W&B mode ``auto`` is online when an API key is configured (``WANDB_API_KEY`` or a netrc entry)
and offline otherwise; offline runs are synced later with ``wandb sync <run_dir>/wandb/...``.
The W&B run id is stored in the run directory, so re-running the same command after a crash
continues the same W&B run. ``metrics.jsonl`` is always written: one JSON object per logged step;
on resume, lines from steps after the checkpoint are dropped so no step appears twice. A torn
last line (a kill or a full disk in the middle of an append) is dropped with one warning and the
run resumes; a bad line anywhere else stops the start with an error naming it, before anything
is written (``megatron_rl/durable.py``). The trimmed file replaces the old one atomically (temp
file, fsync, rename), so a crash during the trim loses nothing either.
"""

from __future__ import annotations

import json
import logging
import math
import os
import uuid
from pathlib import Path
from typing import Any

from megatron_rl.durable import jsonl_rows, write_atomic
from megatron_rl.tracking.config import TrackingConfig

log = logging.getLogger(__name__)


def _wandb_mode(setting: str) -> str:
    if setting != "auto":
        return setting
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    netrc = Path.home() / ".netrc"
    if netrc.is_file() and "api.wandb.ai" in netrc.read_text(errors="ignore"):
        return "online"
    return "offline"


def _clean(value: Any) -> Any:
    """JSON-safe scalar: NaN/inf become strings so the file stays valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class Tracker:
    """One per run, rank 0 only (other ranks get ``enabled=False`` and do nothing)."""

    def __init__(
        self,
        cfg: TrackingConfig,
        run_dir: str | Path,
        config: dict[str, Any],
        resume_step: int | None = None,
        enabled: bool = True,
    ):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.enabled = enabled
        self.jsonl = self.run_dir / "metrics.jsonl"
        self.events = self.run_dir / "events.jsonl"
        self._wandb: Any = None
        if not enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._truncate_after(resume_step)
        self._init_wandb(config, resume=resume_step is not None)

    def _truncate_after(self, step: int | None) -> None:
        """Fresh run (``step`` None): no old logs. Resume: keep the rows of steps <= ``step``;
        every file is read (and checked) before any is rewritten, and one that would not
        change is left as it is."""
        paths = (self.jsonl, self.events)
        if step is None:
            for path in paths:
                path.unlink(missing_ok=True)
            return
        texts = {}
        for path in paths:
            if path.is_file():
                kept = [line for line, row in jsonl_rows(path) if row.get("step", 0) <= step]
                texts[path] = "".join(line + "\n" for line in kept)
        for path, text in texts.items():
            if path.read_text(errors="replace") != text:
                write_atomic(path, text)

    def _init_wandb(self, config: dict[str, Any], resume: bool) -> None:
        mode = _wandb_mode(self.cfg.wandb)
        if mode == "disabled":
            return
        try:
            import wandb
        except ImportError:
            log.warning("wandb is not installed; logging to metrics.jsonl only")
            return
        id_file = self.run_dir / "wandb_id.txt"
        if resume and id_file.is_file():
            run_id = id_file.read_text().strip()
        else:
            run_id = uuid.uuid4().hex[:12]
            write_atomic(id_file, run_id)
        os.environ.setdefault("WANDB_SILENT", "true")
        self._wandb = wandb.init(
            project=self.cfg.project,
            entity=self.cfg.entity,
            name=self.run_dir.name,
            id=run_id,
            resume="allow",
            dir=str(self.run_dir),
            mode=mode,  # type: ignore[arg-type]
            config=config,
            settings=wandb.Settings(console="off", x_disable_stats=True),
        )
        log.info("W&B %s run %s (dir %s)", mode, run_id, self.run_dir / "wandb")

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Append one step's scalar metrics to metrics.jsonl and W&B."""
        if not self.enabled:
            return
        row = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        with self.jsonl.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in metrics.items()}, step=step)

    def event(self, step: int, kind: str, **fields: Any) -> None:
        """A discrete event (regression, recovery, NaN loss, engine restart, ...)."""
        if not self.enabled:
            return
        row = {"step": step, "event": kind, **fields}
        with self.events.open("a") as f:
            f.write(json.dumps(row, default=str) + "\n")
        log.info("event at step %d: %s %s", step, kind, fields)
        if self._wandb is not None:
            self._wandb.log({f"events/{kind}": 1}, step=step)

    def table(self, step: int, name: str, columns: list[str], rows: list[list[Any]]) -> None:
        """A W&B table (e.g. sampled trajectories); also appended to <name>.jsonl."""
        if not self.enabled:
            return
        with (self.run_dir / f"{name}.jsonl").open("a") as f:
            for r in rows:
                f.write(json.dumps({"step": step, **dict(zip(columns, r, strict=True))}) + "\n")
        if self._wandb is not None:
            import wandb

            self._wandb.log({name: wandb.Table(columns=list(columns), data=rows)}, step=step)

    def image(self, step: int, name: str, path: str | Path) -> None:
        if self.enabled and self._wandb is not None:
            import wandb

            self._wandb.log({name: wandb.Image(str(path))}, step=step)

    def finish(self) -> None:
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
