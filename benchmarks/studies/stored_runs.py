"""Studies stored run by run: a section per part, each finished run written as it finishes.

Used by the many-domain study (``many_domains.py``) and the model-reward study
(``model_rewards.py``). A section keeps its settings and each arm's config; a run is reused only
under the same settings and arm config, so a part can stop and resume (a changed arm config
reruns that arm; changed settings are refused). ``recheck`` is the statistics scripts' check:
recompute every statistic from the stored runs and compare with the stored ones.
"""

from __future__ import annotations

import fcntl
import json
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.harness import ROOT, read_text, to_bytes
from benchmarks.studies.scheduler_stats import close

Job = tuple[str, int]  # (arm, seed)


@contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Hold ``path``'s lock file while a part runs: two runners of one study would each write
    the document they read at start, and the later write would drop the other's runs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.with_name(path.name + ".lock").open("w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SystemExit(
                f"{path} is being written by another runner of this study; wait for it to end "
                "(each part stores its runs as they finish, so run parts one after another)"
            ) from None
        yield


def section(
    doc: dict[str, Any], name: str, settings: dict[str, Any], arms: dict[str, list[str]]
) -> dict[str, Any]:
    """The stored section ``name`` (made if new), checked against ``settings``; an arm whose
    config changed loses its stored runs."""
    sec = doc["sections"].setdefault(name, {"settings": settings, "runs": {}, "arms": {}})
    sec.setdefault("arms", {})
    if sec["settings"] != settings:
        raise SystemExit(f"section {name!r} was run with {sec['settings']}; not {settings}")
    for arm, cfg in arms.items():
        if sec["arms"].get(arm, cfg) != cfg:
            sec["runs"].pop(arm, None)
        sec["arms"][arm] = cfg
    return sec


def todo(sec: dict[str, Any], arms: dict[str, list[str]], seeds: tuple[int, ...]) -> list[Job]:
    """The (arm, seed) runs not stored yet, seed by seed."""
    return [(arm, s) for s in seeds for arm in arms if str(s) not in sec["runs"].get(arm, {})]


def slug(arm: str) -> str:
    return re.sub(r"[^0-9a-zA-Z]+", "_", arm).strip("_")


def train(config: str, overrides: list[str], run_dir: str, name: str) -> Path:
    """One fresh ``megatron-rl train`` run of ``config`` into ``run_dir/name`` (its output in
    ``bench_stdout.txt``); RuntimeError with the output's tail if it fails."""
    out = Path(run_dir) / name
    shutil.rmtree(out, ignore_errors=True)  # a fresh run (the CLI would resume an old one)
    out.mkdir(parents=True)
    cmd = [sys.executable, "-m", "launch.cli", "train", config, f"output_dir={run_dir}"]
    cmd += [f"run_name={name}", *overrides]
    with (out / "bench_stdout.txt").open("w") as log:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        tail = (out / "bench_stdout.txt").read_text()[-2000:]
        raise RuntimeError(f"{name} failed (rc {rc}):\n{tail}")
    return out


def sweeps(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A run's held-out sweeps from its metrics rows: per domain accuracy and standard error,
    and ``step``, the training steps done before it."""
    n_steps = sum("rollout/groups_generated" in r for r in rows)
    by_step: dict[int, dict[str, Any]] = {}  # a sweep's row is logged twice (sweep, step end)
    for r in rows:
        if "eval/mean_accuracy" in r:
            by_step.setdefault(int(r["step"]), {}).update(r)
    out = []
    for i, (at, r) in enumerate(sorted(by_step.items())):
        # the sweep before training is at 0; a periodic one follows step `at` (0-based), so
        # at + 1 steps are done; the final one is logged at the step count itself
        done = 0 if i == 0 else min(at + 1, n_steps)
        names = [k[5:-9] for k in r if k.startswith("eval/") and k.endswith("/accuracy")]
        names = sorted(n for n in names if n != "mean" and "/level" not in n)
        acc = {n: round(r[f"eval/{n}/accuracy"], 6) for n in names}
        se = {n: round(r.get(f"eval/{n}/stderr", 0.0), 6) for n in names}
        out.append({"step": done, "acc": acc, "se": se})
    return out


def run_jobs(
    jobs: list[Job],
    attempt: Callable[[Job], dict[str, Any]],
    sec: dict[str, Any],
    doc: dict[str, Any],
    path: Path,
    compute: Callable[[dict[str, Any]], Any],
    workers: int,
) -> list[str]:
    """Run ``attempt(job)`` for every job, ``workers`` at once; each extract is stored in
    ``sec`` and the whole document (statistics recomputed) written as soon as it finishes.
    A job that raises RuntimeError is reported and skipped; returns the failed ones."""
    lock, failed, t0 = threading.Lock(), [], time.time()

    def one(job: Job) -> None:
        arm, s = job
        try:
            ex = attempt(job)
        except RuntimeError as e:
            print(e, file=sys.stderr, flush=True)
            failed.append(f"{arm} seed {s}")
            return
        with lock:
            sec["runs"].setdefault(arm, {})[str(s)] = ex
            doc["stats"] = json.loads(json.dumps(compute(doc)))
            write(path, doc)
            print(f"{arm} seed {s}: done, {time.time() - t0:.0f} s into the part", flush=True)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(one, jobs))
    doc["stats"] = json.loads(json.dumps(compute(doc)))
    write(path, doc)
    return failed


def recheck(path: Path, doc: dict[str, Any], now: dict[str, Any], store: bool) -> int:
    """Compare the recomputed statistics ``now`` with the stored ones (``store``: replace them
    first, after a change to the statistics code); prints the differences; exit status."""
    if store:
        with exclusive(path):
            doc["stats"] = now
            write(path, doc)
    bad = differences(now, doc.get("stats", {}))
    n = sum(len(r) for s in doc.get("sections", {}).values() for r in s.get("runs", {}).values())
    if bad:
        print(f"{path}: {len(bad)} statistics differ from the stored ones:", *bad[:20], sep="\n")
        return 1
    print(f"{path}: every statistic of {n} runs recomputed and agrees")
    return 0


def read(path: Path) -> dict[str, Any]:
    return json.loads(read_text(path))


def write(out: Path, doc: dict[str, Any]) -> None:
    """The whole JSON, written atomically (a kill mid-write keeps the previous file); gzip
    (deterministic) when ``out`` ends in ``.gz``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(to_bytes(out, json.dumps(doc, indent=1) + "\n"))
    tmp.replace(out)


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two statistics trees disagree (floats within 1e-9)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}/{k}: only one side" for k in sorted(set(a) ^ set(b))]
        for k in sorted(set(a) & set(b)):
            out += differences(a[k], b[k], f"{path}/{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        out = []
        for i, (p, q) in enumerate(zip(a, b, strict=True)):
            out += differences(p, q, f"{path}[{i}]")
        return out
    return [] if close(a, b) else [f"{path}: {a!r} != {b!r}"]
