"""Weight versions on shared disk: what a rollout server the fleet restarts must load first.

The trainer's ``sglang`` engine numbers every weight push (``version`` only grows, across
restarts of the trainer too) and records the newest in ``<sync_dir>/current_weights.json``
(``{"path", "version"}``); :mod:`launch.servers` loads that record into a restarted server
before the router sees it again.

* ``weight_sync: disk``: the version folder is what the servers load, written before the push.
* ``weight_sync: distributed``: the servers get the weights by broadcast; the folder only serves
  restarts, so it is written *in the background* (:meth:`VersionLog.write_async`) from a CPU
  snapshot taken at once, and recorded when complete. A server re-added while a version was in
  flight (outside the group that received it) is brought to it from disk right after the
  record (``catch_up``). The next push, and the next generation, first wait for that write.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

log = logging.getLogger(__name__)
WEIGHTS_FILE = "current_weights.json"


def recorded_version(sync_dir: Path) -> int:
    """The version in ``<sync_dir>/current_weights.json`` (0 when there is none): a resumed
    trainer continues from it, so ``v<version>`` folders and versions never go back."""
    try:
        return int(json.loads((sync_dir / WEIGHTS_FILE).read_text())["version"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


class VersionLog:
    """``<sync_dir>/v<version>`` folders (the newest two kept) and the record of the newest."""

    def __init__(self, sync_dir: Path) -> None:
        self.sync_dir = sync_dir
        self._writer: threading.Thread | None = None
        self._failed: BaseException | None = None

    def write(self, state: dict[str, Tensor], version: int) -> Path:
        """Write ``v<version>`` now (the servers will read it: must be shared disk)."""
        from megatron_rl.rollout.weight_sync import write_safetensors

        out = self.sync_dir / f"v{version:06d}"
        write_safetensors(state, out)
        for old in sorted(self.sync_dir.glob("v*"))[:-2]:  # keep the current and previous
            shutil.rmtree(old, ignore_errors=True)
        return out.resolve()

    def record(self, path: str, version: str) -> None:
        """``current_weights.json`` := this version (atomic rename)."""
        self.sync_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.sync_dir / (WEIGHTS_FILE + ".tmp")
        tmp.write_text(json.dumps({"path": path, "version": version}))
        tmp.replace(self.sync_dir / WEIGHTS_FILE)

    def write_async(
        self, state: dict[str, Tensor], version: int, catch_up: Callable[[str, str], None]
    ) -> None:
        """Snapshot ``state`` to CPU now; write, record, then ``catch_up(path, version)`` on a
        thread. One write at a time: an earlier one is waited for first."""
        self.join()
        snap = {k: v.detach().to("cpu", copy=True) for k, v in state.items()}

        def run() -> None:
            try:
                path = str(self.write(snap, version))
                self.record(path, str(version))
                catch_up(path, str(version))
            except BaseException as e:  # reported by join(), in the caller's thread
                self._failed = e

        self._writer = threading.Thread(target=run, daemon=True, name=f"weights-v{version}")
        self._writer.start()

    def join(self) -> None:
        """Wait for the background write; a failure is logged (the broadcast reached the
        servers; only restarts lose the record) and the record stays at the version before."""
        if self._writer is not None:
            self._writer.join()
            self._writer = None
        if self._failed is not None:
            log.error(
                "writing the weight record failed (restarted servers load the previous "
                "version until the next push): %r",
                self._failed,
            )
            self._failed = None
