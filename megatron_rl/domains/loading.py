"""The domains a run asks for: registered plugins plus JSONL task files, selected by pattern.

:func:`load_domains` joins the plugin registry (:mod:`megatron_rl.domains.registry`) and the
task sets defined by a file (:mod:`megatron_rl.domains.jsonl`); the registry itself imports
neither, so a task set that scores by another domain's verifier can look that domain up in it.
"""

from __future__ import annotations

from collections.abc import Sequence

from megatron_rl.domains.base import Domain
from megatron_rl.domains.registry import registry, select


def load_domains(
    include: Sequence[str] | None = None,
    exclude: Sequence[str] = (),
    task_files: Sequence[str] = (),
    strict: bool = False,
) -> dict[str, Domain]:
    """The selected domains by name. ``include=None`` selects all; patterns are fnmatch globs.

    ``task_files`` adds JSONL task sets (see :mod:`megatron_rl.domains.jsonl`). With ``strict``,
    any plugin error raises ``ValueError``; otherwise errors are logged and the rest load.
    """
    reg = registry()
    if strict and reg.errors:
        raise ValueError("; ".join(str(e) for e in reg.errors))
    pool = dict(reg.domains)
    if task_files:
        from megatron_rl.domains.jsonl import domains_from_files

        for d in domains_from_files(task_files):
            if d.name in pool:
                raise ValueError(
                    f"task file domain {d.name!r} clashes with plugin {pool[d.name].plugin!r}"
                )
            pool[d.name] = d
    return {n: pool[n] for n in select(list(pool), include, exclude)}
