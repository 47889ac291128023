"""Where the fleet's API key comes from (megatron_rl/rollout/auth.py), and the embedded server's
request guard (megatron_rl/rollout/server_guard.py): values, not "it runs"."""

from __future__ import annotations

import multiprocessing as mp
import stat
from pathlib import Path

import pytest

from megatron_rl.rollout import auth
from megatron_rl.rollout.server_guard import QueueBound, TrainerCheck

KEY = "k" * 40


def _make(run_dir: str, out: mp.Queue) -> None:  # type: ignore[type-arg]
    out.put(auth.fleet_key(run_dir))


def test_env_key_wins_then_the_file_then_the_run_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(auth.API_KEY_ENV, KEY)
    assert auth.fleet_key(tmp_path / "run") == KEY
    assert not (tmp_path / "run" / "api_key").exists()  # nothing written when the env has one
    monkeypatch.delenv(auth.API_KEY_ENV)
    f = tmp_path / "key.txt"
    f.write_text("f" * 20 + "\n")
    f.chmod(0o600)
    assert auth.fleet_key(tmp_path / "run", str(f)) == "f" * 20
    made = auth.fleet_key(tmp_path / "run")
    assert stat.S_IMODE((tmp_path / "run" / "api_key").stat().st_mode) == 0o600
    assert auth.fleet_key(tmp_path / "run") == made  # read back, not made again
    assert auth.client_key("", [tmp_path / "nowhere", tmp_path / "run"]) == made
    assert auth.client_key("", [tmp_path / "nowhere"]) is None


def test_fleets_racing_on_one_run_dir_agree_on_one_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(auth.API_KEY_ENV)  # the children make the file
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    procs = [ctx.Process(target=_make, args=(str(tmp_path), out)) for _ in range(6)]
    for p in procs:
        p.start()
    keys = {out.get(timeout=60) for _ in procs}
    for p in procs:
        p.join(30)
    assert len(keys) == 1 and keys == {(tmp_path / "api_key").read_text().strip()}
    assert [p.name for p in tmp_path.iterdir()] == ["api_key"]  # no temp file left


@pytest.mark.parametrize(
    "bad", ["short", "has space in the middle of it", "tab\tin-the-key-012345"]
)
def test_weak_or_malformed_keys_are_refused_with_their_source_named(
    bad: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(auth.API_KEY_ENV, bad)
    with pytest.raises(ValueError, match="MEGATRON_RL_API_KEY"):
        auth.fleet_key(tmp_path)
    monkeypatch.delenv(auth.API_KEY_ENV)
    f = tmp_path / "k"
    f.write_text(bad)
    with pytest.raises(ValueError, match=str(f)):
        auth.client_key(str(f))
    with pytest.raises(ValueError, match="cannot read"):
        auth.client_key(str(tmp_path / "missing"))


def test_bearer_check_is_exact() -> None:
    assert auth.authorized(f"Bearer {KEY}", KEY)
    for header in (None, "", KEY, f"Bearer {KEY}x", f"bearer {KEY}", f"Basic {KEY}", "Bearer "):
        assert not auth.authorized(header, KEY), header


def test_only_the_configured_trainer_may_lead_a_weight_group() -> None:
    assert TrainerCheck("127.0.0.1").refuse("127.0.0.1") is None
    assert TrainerCheck("127.0.0.1").refuse("192.0.2.7") is not None
    assert TrainerCheck("192.0.2.7").refuse("127.0.0.1") is not None
    assert TrainerCheck("").refuse("localhost") is None  # unset: an address of this host
    assert TrainerCheck("").refuse("192.0.2.7") is not None  # TEST-NET-1: never this host
    assert TrainerCheck("").refuse("no-such-host.invalid") is not None


def test_the_queue_bound_takes_and_gives_back() -> None:
    q = QueueBound(10)
    assert q.take(6) and not q.take(5) and q.take(4)
    q.give(6)
    assert q.used == 4 and q.take(6) and not q.take(1)
    with pytest.raises(ValueError, match=">= 1"):
        QueueBound(0)
