"""Run every CPU benchmark in one go (``make bench``) and collect their numbers.

Each benchmark runs as its own subprocess with a timeout (one that fails or times out is recorded
with its status and the rest go on). Ours write ``--json``; the other engineers' scripts that only
print are parsed (a JSON line where they print one, else their stdout tail is kept). Results:

- ``benchmarks/results.json``: ``{"meta": {...}, "<bench>": {headline keys..., "raw": ...}}``,
  with at least ``rl_vs_trl.step_time_ratio``, ``rl_vs_trl.accuracy`` (both tools),
  ``rollout.tokens_per_s``, ``train.mfu`` and ``weight_sync.seconds``;
- ``benchmarks/results.md``: the markdown table generated from that file (``tables.py``), also
  written into ``benchmarks/README.md`` between the ``results`` markers.

``--only rl_vs_trl,train`` re-runs just those and merges into the existing results.json. Every
number comes from the run; the table adds the date, core count and load average it ran under.
The tables are only ever generated from results.json: ``--render`` rewrites them from it without
running anything, ``--check`` exits 1 if one differs. ``--quick`` (a smoke run) writes only under
``benchmarks/out/``, never the tracked results or READMEs; tests point every path at a temp copy.

    .venv/bin/python -m benchmarks.run_all [--only NAME[,NAME]] [--quick] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.harness import OUT, ROOT, machine
from benchmarks.tables import headline, markdown

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results.json"
README = HERE / "README.md"
TOP_README = ROOT / "docs" / "results.md"  # the headline table (the README links to it)
MARK_START, MARK_END = "<!-- results:start -->", "<!-- results:end -->"


@dataclass
class Bench:
    """One benchmark: its module and arguments, a timeout and how to read its numbers."""

    module: str  # run as ``python -m MODULE`` from the repository root
    args: list[str]  # command-line arguments (``{out}`` is replaced by the JSON path)
    timeout_s: float  # wall-clock limit of the subprocess
    headline: Callable[[dict[str, Any]], dict[str, Any]] = lambda raw: {}  # key numbers
    json_out: bool = True  # the script writes --json; else its stdout is parsed
    quick_args: list[str] = field(default_factory=list)  # replaces args under --quick
    takes_threads: bool = True  # the script accepts --threads (torch CPU threads)


def _rl_vs_trl(r: dict[str, Any]) -> dict[str, Any]:
    """Per size (tiny, m20): synchronous step-time ratio (median of the interleaved repeats)
    and the overlapped (one-step off-policy) one, step times, phases, tokens/s, accuracy."""
    keys = ("step_time_ratio", "step_cpu_ratio", "step_s", "trained_tokens_per_s",
            "response_tokens_per_s", "accuracy", "step_time_ratio_repeats")  # fmt: skip
    out: dict[str, Any] = {}
    for size, res in r.items():
        if not (isinstance(res, dict) and "step_time_ratio" in res):
            continue
        out[size] = {**{k: res[k] for k in keys if k in res}, "phases": res["phases"]}
        if "overlapped" in res:
            over = res["overlapped"]
            out[size]["overlapped"] = {k: over[k] for k in ("label", "step_time_ratio", "step_s")}
    return out


def _rl_vs_trl_gain(r: dict[str, Any]) -> dict[str, Any]:
    """Time to +10 held-out points over paired seeds: per seed both tools' steps and seconds
    and the ratio; the median ratio and its interval, like for like and for the demo recipe."""
    st = r["time_to_10"]
    per_seed = {
        k: {"start": row["start"], "ratio": row["ratio"]["ratio"], "bound": row["ratio"]["bound"],
            **{f"{arm}_{x}": row[arm][x] for arm in ("megatron_rl", "trl") for x in
               ("steps", "seconds", "reached")}}
        for k, row in st.get("per_seed", {}).items()
    }  # fmt: skip
    return {
        "per_seed": per_seed,
        "like_for_like": st["like_for_like"],
        "demo_recipe": st["demo_recipe"],
        "step_time_ratio": st["step_time_ratio"],
        "text": gain_text(st["like_for_like"]),
        "demo_text": gain_text(st["demo_recipe"]),
    }


def gain_text(s: dict[str, Any]) -> str:
    """A time-to-+10 summary as the README shows it: median, interval, seeds, bounds."""
    if "median" not in s:
        return "no seed run yet"
    ci = s.get("ci95")
    ci_text = f"; 95% CI of the geometric mean {ci[0]:.2f}-{ci[1]:.2f}" if ci else ""
    kinds = ", ".join(sorted(set(s["seeds_not_equal"])))
    bounds = f"; {len(s['seeds_not_equal'])} seed(s) a bound ({kinds})" if kinds else ""
    return f"{s['median']:.2f}, median of {s['n']} seeds{ci_text}{bounds}"


def _rollout(r: dict[str, Any]) -> dict[str, Any]:
    tps = {
        f"{size}/{eng}": v["tokens_per_s"]
        for size, res in r.items()
        for eng, v in res.items()
        if isinstance(v, dict) and "tokens_per_s" in v
    }
    ratio = {
        k: v / tps[f"{k.split('/')[0]}/transformers"]
        for k, v in tps.items()
        if not k.endswith("/transformers")
    }
    return {"tokens_per_s": tps, "ratio_vs_transformers": ratio}


BENCHES: dict[str, Bench] = {
    "rl_vs_trl": Bench(
        "benchmarks.rl_vs_trl",
        ["--sizes", "tiny,m20", "--json", "{out}"],
        5400,
        _rl_vs_trl,
        quick_args=["--sizes", "tiny", "--steps", "2", "--prompts", "4", "--eval-n", "4"]
        + ["--repeats", "1", "--json", "{out}"],
    ),
    "rl_vs_trl_gain": Bench(  # stored seed by seed: runs only the seeds not stored yet
        "benchmarks.rl_vs_trl_gain",
        ["--json", "{out}"],
        4 * 3600,
        _rl_vs_trl_gain,
        quick_args=["--quick", "--seeds", "1", "--json", "{out}"],
    ),
    "rollout": Bench(
        "benchmarks.rollout_engines",
        ["--sizes", "3m,100m", "--json", "{out}"],
        600,
        _rollout,
        quick_args=["--sizes", "3m", "--engines", "hf", "--prompts", "4", "--json", "{out}"],
    ),
    "train": Bench(
        "benchmarks.train_step",
        ["--json", "{out}"],
        600,
        lambda r: {"mfu": r["mfu"], "tokens_per_s": r["tokens_per_s"]},
        quick_args=["--sizes", "tiny", "--steps", "1", "--seqs", "16", "--json", "{out}"],
    ),
    "time_split": Bench(
        "benchmarks.time_split",
        ["--steps", "4", "--json", "{out}"],
        600,
        lambda r: {"share": r["share"], "step_s": r["step_s"]},
        quick_args=["--steps", "1", "--json", "{out}"],
    ),
    "weight_sync": Bench(
        "benchmarks.weight_sync",
        ["--metrics", str(OUT / "time_split" / "metrics.jsonl"), "--json", "{out}"],
        600,
        lambda r: {
            "seconds": r["seconds"],
            "demo_step_fraction": (r.get("demo_step") or {}).get("fraction"),
        },
        quick_args=["--sizes", "demo", "--repeats", "1", "--json", "{out}"],
    ),
    "scoring": Bench("benchmarks.scoring", ["--json", "{out}"], 300, takes_threads=False),
    "sandbox": Bench("benchmarks.sandbox_throughput", [], 300, json_out=False, takes_threads=False),
    "packing": Bench("benchmarks.packing", [], 300, json_out=False),
    "convert": Bench("benchmarks.convert_speed", [], 300, json_out=False, takes_threads=False),
    "long_context": Bench(
        "benchmarks.long_context_cp",
        ["--json", "{out}"],
        1800,
        lambda r: {"cp2_vs_cp1": r["cp2_vs_cp1"]},
        quick_args=["--lengths", "2048", "--steps", "1", "--json", "{out}"],
        takes_threads=False,
    ),
}


def parse_stdout(text: str) -> dict[str, Any]:
    """A benchmark's printed output: its last JSON-object line if any, else its last lines."""
    lines = [x for x in text.splitlines() if x.strip()]
    for line in reversed(lines):
        if line.lstrip().startswith("{"):
            try:
                return dict(json.loads(line))
            except json.JSONDecodeError:
                break
    return {"stdout_tail": lines[-12:]}


def run_one(name: str, bench: Bench, quick: bool, threads: int = 0) -> dict[str, Any]:
    """Run one benchmark subprocess; returns its entry for results.json (never raises)."""
    OUT.mkdir(parents=True, exist_ok=True)
    out = OUT / f"{name}.json"
    out.unlink(missing_ok=True)
    args = bench.quick_args if quick and bench.quick_args else bench.args
    if threads and bench.takes_threads:
        args = [*args, "--threads", str(threads)]
    cmd = [sys.executable, "-m", bench.module, *(a.replace("{out}", str(out)) for a in args)]
    print(f"== {name}: {' '.join(cmd[1:])} (timeout {bench.timeout_s:.0f} s)", flush=True)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, timeout=bench.timeout_s, stdout=subprocess.PIPE, text=True
        )
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "wall_s": round(time.perf_counter() - t0, 1)}
    entry: dict[str, Any] = {"wall_s": round(time.perf_counter() - t0, 1)}
    print(proc.stdout[-4000:], flush=True)
    if proc.returncode != 0:
        return dict(entry, status=f"failed (exit {proc.returncode})")
    try:
        raw = json.loads(out.read_text()) if bench.json_out else parse_stdout(proc.stdout)
        return dict(entry, status="ok", **bench.headline(raw), raw=raw)
    except (OSError, ValueError, KeyError, TypeError) as e:
        return dict(entry, status=f"unreadable output: {e!r}")


def _replace_between_markers(path: Path, table: str) -> None:
    if not path.is_file():
        return
    text = path.read_text()
    if MARK_START in text and MARK_END in text:
        head, rest = text.split(MARK_START, 1)
        tail = rest.split(MARK_END, 1)[1]
        path.write_text(f"{head}{MARK_START}\n{table}{MARK_END}{tail}")


def _block(path: Path) -> str | None:
    """The text between the results markers of ``path`` (None without the file or markers)."""
    text = path.read_text() if path.is_file() else ""
    if MARK_START not in text or MARK_END not in text:
        return None
    return text.split(MARK_START, 1)[1].split(MARK_END, 1)[0].removeprefix("\n")


def stale_tables(results: dict[str, Any]) -> list[str]:
    """Files whose generated block or table differs from what ``results`` generates."""
    want = {README: markdown(results), TOP_README: headline(results)}
    stale = [str(p) for p, table in want.items() if _block(p) not in (None, table)]
    md = HERE / "results.md"
    if md.is_file() and md.read_text() != want[README]:
        stale.append(str(md))
    return stale


def write_outputs(results: dict[str, Any], tracked: bool = True) -> None:
    """results.json, results.md and both README blocks; a quick run writes only under out/."""
    if not tracked:
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "results.quick.json").write_text(json.dumps(results, indent=2) + "\n")
        (OUT / "results.quick.md").write_text(markdown(results))
        return
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    table = markdown(results)
    (HERE / "results.md").write_text(table)
    _replace_between_markers(README, table)
    _replace_between_markers(TOP_README, headline(results))


def render_or_check(check: bool) -> int:
    """--render: regenerate the tables from results.json; --check: exit 1 if any is stale."""
    results = json.loads(RESULTS.read_text())
    if not check:
        write_outputs(results)
        return 0
    stale = stale_tables(results)
    for path in stale:
        print(f"{path}: results table differs from what results.json generates", file=sys.stderr)
    return 1 if stale else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="", help=f"comma list of {sorted(BENCHES)}")
    p.add_argument("--quick", action="store_true", help="tiny settings (a smoke run, not numbers)")
    p.add_argument(
        "--threads", type=int, default=0, help="torch threads for every benchmark (0: their own)"
    )
    p.add_argument("--render", action="store_true", help="rewrite the tables from results.json")
    p.add_argument("--check", action="store_true", help="exit 1 if a table is not results.json's")
    a = p.parse_args()
    if a.render or a.check:
        return render_or_check(a.check)
    names = [n for n in a.only.split(",") if n] or list(BENCHES)
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        print(f"unknown benchmark {unknown[0]!r}; choose from {sorted(BENCHES)}", file=sys.stderr)
        return 2
    merge = a.only and not a.quick and RESULTS.is_file()
    results = json.loads(RESULTS.read_text()) if merge else {}
    before = results.get("meta", {})
    results["meta"] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        **machine(),  # cores, load_avg_1m, python, torch, git
        "quick": a.quick,
        "threads": a.threads or "each benchmark's default (2)",
    }
    if merge:  # which rows this run measured, and when the full run behind the others was
        others = before.get("others_from") or before.get("date", "?")
        results["meta"].update(only=names, others_from=others)
    t0 = time.perf_counter()
    ran = f"{results['meta']['date']}, threads {a.threads or 'default'}"
    for name in names:
        entry = run_one(name, BENCHES[name], a.quick, a.threads)
        results[name] = {"ran": ran + (", quick" if a.quick else ""), **entry}
        write_outputs(results, not a.quick)  # keep what finished if a later one hangs
    results["meta"]["total_s"] = round(time.perf_counter() - t0, 1)
    write_outputs(results, not a.quick)
    print(markdown(results))
    failed = [n for n in names if results[n].get("status") != "ok"]
    print(f"total {results['meta']['total_s']:.0f} s; not ok: {failed or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
