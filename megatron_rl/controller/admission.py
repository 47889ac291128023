"""Start-up fit check: which selected domains and levels this policy can run at all.

Before the run writes anything, every selected domain is tried at each level the run can use
(``domains.level``, else all of its levels) on ``domains.fit_samples`` prompts drawn in the
domain workers (half from each split), under the task deadline. A level is left out when

- a sample's prompt, as the engine sees it (chat template included), plus
  ``rollout.max_new_tokens`` is longer than the policy's context (``too_long``);
- its generator raised on a sample (``generator_error``) or passed ``domains.task_timeout_s``
  (``generator_timeout``), or its worker died (``generator_died``).

A domain keeps the levels that fit; one with none left is left out. Each gets one log line
naming the domain, the level, the longest sample and the limit (or the failure); the run's
summary lists them. With ``domains.strict: true`` the run refuses instead: one ``ValueError``
listing every unfit domain and level, raised before the run directory is touched.

The sample is a check, not a proof: a rare longer prompt later is dropped at generation and
counted as ``too_long`` (megatron_rl/domains/health.py).
"""

from __future__ import annotations

import copy
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from megatron_rl.config import RunConfig
from megatron_rl.domains import Domain, Task, code_exec, load_domains
from megatron_rl.domains.workers import Call, DomainWorkers
from megatron_rl.model.config import ModelConfig
from megatron_rl.model.tokenizer import prompt_ids, render_chat

log = logging.getLogger(__name__)
CHARS_PER_TOKEN = 64  # a prompt longer than the limit times this is too long untokenized


@dataclass(frozen=True)
class LeftOut:
    """A domain (``level`` None: every level) or one level of it that the run cannot use."""

    domain: str
    level: int | None
    reason: str  # too_long, generator_error, generator_timeout, generator_died
    detail: str

    def line(self) -> str:
        where = self.domain if self.level is None else f"{self.domain} level {self.level}"
        return f"{where}: {self.reason}: {self.detail}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "domain": self.domain,
            "level": self.level,
            "reason": self.reason,
            **{"detail": self.detail},
        }


@dataclass
class Admission:
    """The domains a run uses (levels narrowed to those that fit) and what was left out."""

    domains: dict[str, Domain]
    left_out: list[LeftOut] = field(default_factory=list)
    seconds: float = 0.0
    limit: int = 0  # longest prompt the run admits, in tokens
    workers: DomainWorkers | None = None  # the run's domain workers, already started

    def summary(self) -> dict[str, Any]:
        return {
            "admitted": len(self.domains),
            "left_out": [x.to_dict() for x in self.left_out],
            "prompt_limit_tokens": self.limit,
            "fit_check_s": round(self.seconds, 1),
        }


def prompt_limit(model: ModelConfig, max_new_tokens: int) -> int:
    """The longest prompt (tokens) that leaves room for the response budget."""
    return model.max_position_embeddings - max_new_tokens


def token_length(tokenizer: Any, prompt: str, limit: int) -> int:
    """Tokens of ``prompt`` as the engine gets it; a prompt too long by its characters alone
    (over ``limit * CHARS_PER_TOKEN``) is not tokenized and counts as that many characters."""
    if len(prompt) > limit * CHARS_PER_TOKEN:
        return len(prompt)
    return len(prompt_ids(tokenizer, prompt))


def prompt_fits(tokenizer: Any, limit: int) -> Callable[[str], bool]:
    """A test of whether a prompt fits ``limit`` tokens that tokenizes only when it must: an
    ASCII prompt of at most ``limit`` characters with the chat template's (plus a margin for a
    tokenizer's prefix token) fits, since every token covers at least one byte of text."""
    overhead = len(render_chat(tokenizer, [{"role": "user", "content": ""}])) + 8

    def fits(prompt: str) -> bool:
        if prompt.isascii() and len(prompt) + overhead <= limit:
            return True
        return token_length(tokenizer, prompt, limit) <= limit

    return fits


def fit_calls(
    d: Domain, level: int | None, samples: int, seed: int, timeout_s: float
) -> list[Call]:
    """The sample draws for one domain: ``samples`` per level, split over its splits."""
    levels = list(d.levels) if level is None else [level if level in d.levels else d.levels[0]]
    calls = []
    for lv in levels:
        for k in range(samples):
            split = d.splits[k % len(d.splits)]
            # indices far from those a run uses first: the check never warms a cursor's tasks
            calls.append(Call("task", d.name, (split, 10_000 + k, lv, seed), timeout_s))
    return calls


def admit(
    cfg: RunConfig,
    model: ModelConfig,
    tokenizer: Any,
    workers: DomainWorkers | None = None,
) -> Admission:
    """Check every selected domain and level; see the module docstring. ``workers``: the run's
    domain workers (started here when None and kept in the result for the run)."""
    t0 = time.time()
    d = cfg.domains
    domains = load_domains(d.include, d.exclude, d.task_files)
    # rewards.allow_unsandboxed, in this process and in every domain worker (code verifiers)
    setup = functools.partial(code_exec.configure, cfg.rewards.allow_unsandboxed)
    setup()
    if workers is None:
        workers = DomainWorkers(d.workers, d.task_files, setup=setup)
    limit = prompt_limit(model, cfg.rollout.max_new_tokens)
    # sample k of every domain level before sample k + 1 of any: a level found unfit on its
    # first samples is not drawn again (its later calls are skipped)
    calls = sorted(
        (
            c
            for dom in domains.values()
            for c in fit_calls(dom, d.level, d.fit_samples, cfg.seed, d.task_timeout_s)
        ),
        key=lambda c: c.args[1],
    )
    longest: dict[tuple[str, int], tuple[int, str]] = {}
    failed: dict[tuple[str, int], tuple[str, str]] = {}

    def skip(c: Call) -> bool:  # a level already unfit is not drawn again
        key = (c.domain, c.args[2])
        return key in failed or longest.get(key, (0, ""))[0] > limit

    def done(c: Call, o: Any) -> None:  # tokenized here while the workers draw on
        key = (c.domain, c.args[2])
        if not o.ok:
            if o.failure != "skipped" and key not in failed:
                failed[key] = (f"generator_{o.failure}", o.message)
            return
        task: Task = o.value
        n = token_length(tokenizer, task.prompt, limit)
        if n > longest.get(key, (-1, ""))[0]:
            longest[key] = (n, task.id)

    first = [c for c in calls if c.args[1] == calls[0].args[1]]  # one sample of every level,
    workers.run(first, skip=skip, done=done)  # then the rest of the levels still in the running
    workers.run(calls[len(first) :], skip=skip, done=done)
    left: list[LeftOut] = []
    kept: dict[str, Domain] = {}
    for name, dom in domains.items():
        levels = sorted({c.args[2] for c in fit_calls(dom, d.level, 1, cfg.seed, 0)})
        ok = []
        for lv in levels:
            key = (name, lv)
            if key in failed:
                left.append(LeftOut(name, lv, *failed[key]))
            elif longest[key][0] > limit:
                n, tid = longest[key]
                detail = f"longest sample seen {n} tokens ({tid}) > limit {limit}"
                left.append(LeftOut(name, lv, "too_long", detail + _limit_hint(model, cfg)))
            else:
                ok.append(lv)
        if ok:
            kept[name] = narrowed(dom, ok) if len(ok) < len(levels) and d.level is None else dom
    result = Admission(kept, left, time.time() - t0, limit, workers)
    if left and d.strict:
        workers.close()
        lines = "\n  ".join(x.line() for x in left)
        raise ValueError(
            f"domains.strict: {len(left)} selected domain levels cannot run on this policy:\n  "
            f"{lines}\nexclude them (domains.exclude), or set domains.strict=false to leave "
            "them out"
        )
    for x in left:
        log.warning("left out %s", x.line())
    if not kept:
        workers.close()
        raise ValueError(
            f"no selected domain fits this policy ({len(left)} left out; the first: "
            f"{left[0].line() if left else '-'})"
        )
    log.info(
        "fit check: %d of %d domains admitted, %d domain levels left out (%.1f s)",
        len(kept),
        len(domains),
        len(left),
        result.seconds,
    )
    return result


def narrowed(dom: Domain, levels: list[int]) -> Domain:
    """A copy of ``dom`` offering only ``levels`` (the registry's instance is left as it is)."""
    out = copy.copy(dom)
    out.levels = tuple(levels)
    return out


def _limit_hint(model: ModelConfig, cfg: RunConfig) -> str:
    return (
        f" (context {model.max_position_embeddings} - rollout.max_new_tokens "
        f"{cfg.rollout.max_new_tokens})"
    )
