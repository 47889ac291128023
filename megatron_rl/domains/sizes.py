"""How many distinct prompts a domain level holds: capped draws and a collision estimate.

A generator's prompt space is rarely enumerable, so it is estimated from ``m`` draws that showed
``d`` distinct prompts. For ``N`` equally likely prompts the expected number of distinct values
in ``m`` draws with replacement is ``N (1 - (1 - 1/N)^m)``; :func:`estimate_space` solves that
for ``N`` (the maximum-likelihood estimate, the one-sample form of capture-recapture). With no
repeat at all only a lower bound is known: :func:`space_lower_bound` is the ``N`` below which
``m`` draws would show a repeat with 95% probability (``m (m - 1) / (2 ln 20)``). Generators
whose prompts are not equally likely (sums of digits, say) repeat more often than uniform ones
of the same size, so the estimate errs low: a level flagged small may be a little larger.

Draws are the raw candidates of :meth:`Domain.generate`, sorted into splits by
:func:`~megatron_rl.domains.base.split_of`, exactly as :meth:`Domain.task` sorts them (so the
eval-split draws follow the distribution of eval tasks). Task sets with a finite list report
exact counts (:meth:`Domain.prompt_counts`); other domains that override ``task`` are drawn
through ``task`` itself.

Each draw runs under a CPU-time limit (``hang_s``; SIGVTALRM, main thread only): a generator
that loops forever for some seeds (reasoning-gym 0.1.25's ``arc_1d`` at level 3 does: it looks
for 10 distinct colours among 9) raises :class:`GeneratorHang` naming the draw, instead of
hanging the check.

``megatron-rl domains check`` records its measurements in :func:`cache_path` (under the user's
cache directory, never a tracked file); ``domains list --json`` shows them.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

from megatron_rl.domains.alarm import interrupt_after
from megatron_rl.domains.base import SPLITS, Domain, split_of, stable_int
from megatron_rl.durable import write_atomic

MIN_EVAL_PROMPTS = 128  # fewer distinct eval prompts than this: a level cannot show generalisation
MIN_SPACE = 1000  # a whole prompt space under this is small enough to memorise
DECIDE_EVERY = 32  # draws between checks whether repeat-free draws already cleared both limits
HANG_S = 10.0  # CPU seconds one draw may take before it counts as a hang
CACHE_FILE = "domain_sizes.json"
_LN20 = math.log(20.0)


def estimate_space(draws: int, distinct: int) -> float:
    """MLE of the number of equally likely prompts that ``draws`` draws showing ``distinct``
    distinct ones came from; ``inf`` when no prompt repeated."""
    if draws <= 0:
        return math.inf  # nothing drawn: nothing known
    if distinct >= draws:
        return math.inf

    def expected(n: float) -> float:
        return n * -math.expm1(draws * math.log1p(-1.0 / n)) if n > 1 else 1.0

    lo, hi = float(distinct), float(distinct)
    while expected(hi) < distinct - 1e-9:  # expected() rises with n towards draws
        hi *= 2.0
    for _ in range(100):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if expected(mid) < distinct else (lo, mid)
    return hi


def space_lower_bound(draws: int, distinct: int) -> float:
    """A 95% lower bound on the space: ``distinct`` itself once a prompt repeated, else the size
    below which ``draws`` repeat-free draws would have shown a repeat with 95% probability."""
    if distinct < draws:
        return float(distinct)
    return max(float(distinct), draws * (draws - 1) / (2.0 * _LN20))


@dataclass
class SplitSize:
    """Distinct prompts of one split of one level, measured from capped draws."""

    draws: int  # prompts drawn in this split
    distinct: int  # distinct prompts among them
    estimate: float  # estimated prompts in the split (inf: no repeat seen)
    at_least: float  # 95% lower bound on the prompts in the split
    exact: bool = False  # counted from a finite list, not estimated

    def show(self) -> str:
        if self.exact:
            return f"{self.distinct}"
        if math.isinf(self.estimate):
            return f">={_round(self.at_least)}"
        return f"~{_round(self.estimate)}"

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["estimate"] = None if math.isinf(self.estimate) else round(self.estimate, 1)
        out["at_least"] = round(self.at_least, 1)
        return out


@dataclass
class LevelSize:
    """The prompt space of one (domain, level): per split, the whole, and what is too small."""

    level: int
    train: SplitSize
    eval: SplitSize
    space: SplitSize  # both splits together
    seconds: float  # CPU time the draws took

    @property
    def flags(self) -> list[str]:
        """'small_eval' / 'small_space' where the estimate is below the limits, 'unknown' when
        too few draws were made to tell."""
        out = []
        for name, size, limit in (
            ("small_eval", self.eval, MIN_EVAL_PROMPTS),
            ("small_space", self.space, MIN_SPACE),
        ):
            if size.estimate < limit:
                out.append(name)
            elif math.isinf(size.estimate) and size.at_least < limit and "unknown" not in out:
                out.append("unknown")
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "train": self.train.to_json(),
            "eval": self.eval.to_json(),
            "space": self.space.to_json(),
            "flags": self.flags,
            "seconds": round(self.seconds, 3),
        }


def _round(x: float) -> str:
    return f"{x:.0f}" if x < 10_000 else f"{x:.2g}".replace("e+0", "e").replace("e+", "e")


def _split_size(prompts: list[str]) -> SplitSize:
    d = len(set(prompts))
    return SplitSize(
        len(prompts), d, estimate_space(len(prompts), d), space_lower_bound(len(prompts), d)
    )


def _exact(counts: dict[str, int]) -> dict[str, SplitSize]:
    out = {s: SplitSize(n, n, float(n), float(n), True) for s, n in counts.items()}
    total = sum(counts.values())
    out["space"] = SplitSize(total, total, float(total), float(total), True)
    return out


def _hang(what: str, seconds: float) -> GeneratorHang:
    return GeneratorHang(f"{what}: still running after {seconds:g} s of CPU")


class GeneratorHang(BaseException):
    """A generator draw ran past its CPU-time limit: a run that draws it would hang.

    A ``BaseException`` (like ``KeyboardInterrupt``): it arrives asynchronously, and the
    ``except Exception`` that skips failing draws (here and in ``Domain.task``) must not eat it.
    """


def _room_shown(by_split: dict[str, list[str]]) -> bool:
    """True once repeat-free draws already prove both limits (eval split >= MIN_EVAL_PROMPTS,
    whole space >= MIN_SPACE at 95%): no flag can fire, so more draws would only refine a
    number that is large anyway (the estimate then prints as a lower bound, ``>=N``)."""
    ev, both = by_split["eval"], by_split["train"] + by_split["eval"]
    if len(set(both)) < len(both):
        return False  # a repeat: the lower bound is just the distinct count; keep drawing
    return (
        space_lower_bound(len(ev), len(ev)) >= MIN_EVAL_PROMPTS
        and space_lower_bound(len(both), len(both)) >= MIN_SPACE
    )


def _draw(
    d: Domain, level: int, seed: int, max_draws: int, budget_s: float, hang_s: float
) -> dict[str, list[str]]:
    """Prompts per split from raw generator candidates (or ``task`` where it is overridden)."""
    by_split: dict[str, list[str]] = {s: [] for s in SPLITS}
    start, errors = time.process_time(), 0  # CPU time: the same draws on a busy machine
    raw = type(d).task is Domain.task
    for i in range(max_draws):
        if i and time.process_time() - start > budget_s:
            break
        if i and i % DECIDE_EVERY == 0 and _room_shown(by_split):
            break
        what = f"{d.name} level {level}, draw {i}"
        with interrupt_after(hang_s, partial(_hang, what, hang_s), cpu=True):
            if not raw:
                for split in d.splits:
                    by_split[split].append(d.task(split, i, level, seed).prompt)
                continue
            try:
                rng = random.Random(stable_int(d.name, "size", seed, level, i))
                prompt = d.generate(level, rng)[0]
            except Exception:  # the generator fails for some seeds; task() skips those draws too
                errors += 1
                if errors > max(8, i // 2):
                    raise
                continue
        by_split[split_of(prompt)].append(prompt)
    return by_split


def measure_level(
    d: Domain,
    level: int,
    seed: int = 0,
    max_draws: int = 2048,
    budget_s: float = 0.25,
    hang_s: float = HANG_S,
) -> LevelSize:
    """Estimate the distinct prompts of ``d`` at ``level`` per split from at most ``max_draws``
    draws, stopping early after ``budget_s`` seconds of CPU (at least one draw) or once
    repeat-free draws prove the level has room (:func:`_room_shown`); a draw that takes more
    than ``hang_s`` seconds of CPU raises :class:`GeneratorHang`."""
    start = time.process_time()
    counts = d.prompt_counts(level)
    if counts is not None:
        sizes = _exact({s: counts.get(s, 0) for s in SPLITS})
    else:
        by_split = _draw(d, level, seed, max_draws, budget_s, hang_s)
        sizes = {s: _split_size(p) for s, p in by_split.items()}
        sizes["space"] = _split_size(by_split["train"] + by_split["eval"])
        if type(d).task is not Domain.task:  # split draws were made apart: add their estimates
            sizes["space"] = _sum_sizes(sizes["train"], sizes["eval"])
    return LevelSize(
        level, sizes["train"], sizes["eval"], sizes["space"], time.process_time() - start
    )


def _sum_sizes(a: SplitSize, b: SplitSize) -> SplitSize:
    return SplitSize(
        a.draws + b.draws, a.distinct + b.distinct, a.estimate + b.estimate, a.at_least + b.at_least
    )


def cache_path() -> Path:
    """Where ``domains check`` records sizes: ``$XDG_CACHE_HOME/megatron-rl`` (else
    ``~/.cache/megatron-rl``)."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "megatron-rl" / CACHE_FILE


def load_cache(path: Path | None = None) -> dict[str, Any]:
    """The recorded sizes by domain name ({} when none were recorded or the file is unreadable)."""
    p = path or cache_path()
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def record(sizes: dict[str, list[LevelSize]], seed: int, path: Path | None = None) -> Path:
    """Merge the sizes of the checked domains into the cache file (atomic replace)."""
    p = path or cache_path()
    data = load_cache(p)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    for name, levels in sizes.items():
        data[name] = {"checked_at": stamp, "seed": seed, "levels": [s.to_json() for s in levels]}
    write_atomic(p, json.dumps(data, indent=1, sort_keys=True))
    return p
