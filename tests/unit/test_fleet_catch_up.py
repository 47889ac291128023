"""A restarted server's catch-up (launch.servers.Fleet.catch_up) loads a recorded weight version
only when the record moved past the one it loaded: after the server is registered, the trainer
may already broadcast it the next version, and reloading the same record from disk could land
after that broadcast and take the server back a version (seen once in
tests/integration/test_weight_faults.py: the step after the restart's catch-up generated with
the previous weights)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from launch.servers import Fleet


class RecordingFleet(Fleet):
    def __init__(self, run_dir: Path, records: list[Any], fail: bool = False) -> None:
        super().__init__(run_dir, "model", 1, engine="hf", sync_dir=str(run_dir / "sync"))
        self.records, self.fail, self.loads = records, fail, []

    def current_weights(self) -> Any:
        return self.records.pop(0) if len(self.records) > 1 else self.records[0]

    def load_current_weights(self, p: Any, cur: Any) -> bool:
        self.loads.append(cur)
        return not self.fail


def test_a_second_catch_up_reloads_nothing_unless_the_record_moved(tmp_path: Path) -> None:
    v3, v4, v5 = ({"path": f"/w/{v}", "version": str(v)} for v in (3, 4, 5))
    fleet = RecordingFleet(tmp_path, [v3, v4, v4])  # a sync recorded v4 during the first load
    p = fleet.servers[0]
    loaded = fleet.catch_up(p)
    assert loaded == v4 and fleet.loads == [v3, v4]
    assert fleet.catch_up(p, loaded) == v4 and fleet.loads == [v3, v4]  # registered: no reload
    fleet.records = [v5]  # a sync recorded v5 while it registered: that one is loaded
    assert fleet.catch_up(p, loaded) == v5 and fleet.loads == [v3, v4, v5]


def test_catch_up_before_any_sync_and_on_a_failed_load(tmp_path: Path) -> None:
    fleet = RecordingFleet(tmp_path, [None])
    assert fleet.catch_up(fleet.servers[0]) is None  # no sync yet: the initial weights
    failing = RecordingFleet(tmp_path, [{"path": "/w/3", "version": "3"}], fail=True)
    assert failing.catch_up(failing.servers[0]) is False
