"""Entry point of the ``tiny`` family, and of ``tinymix``, ``tinysched``, ``tinywide``, ``ladder``.

The domains themselves: :mod:`domains.tiny_domain` (``tiny/*``), :mod:`domains.tiny_mix`,
:mod:`domains.tiny_sched`, :mod:`domains.tiny_wide` and :mod:`domains.ladders`. Each of those
imports :class:`~domains.tiny_domain.TinyDomain` and none imports this module, so the five families
register through one entry point without an import circle.
"""

from __future__ import annotations

from domains.ladders import ladder_domains
from domains.tiny_constraint import constraint_domains
from domains.tiny_domain import CONFIGS, TinyDomain
from domains.tiny_mix import mix_domains
from domains.tiny_sched import sched_domains
from domains.tiny_wide import wide_domains
from megatron_rl.domains.base import Domain

__all__ = ["CONFIGS", "TinyDomain", "domains"]


def domains() -> list[Domain]:
    """Entry point of the ``tiny`` family, and of ``tinymix`` (see :mod:`domains.tiny_mix`) and
    ``tinysched`` (:mod:`domains.tiny_sched`), ``tinywide`` (:mod:`domains.tiny_wide`) and
    ``ladder`` (:mod:`domains.ladders`), ``tinycon`` (:mod:`domains.tiny_constraint`).

    ``tinymix/*``, ``tinysched/*``, ``tinywide/*`` and ``ladder/*`` ride on this entry point
    rather than their own, so that an existing editable install sees them without
    re-installing the package.
    """
    tiny = [TinyDomain(g) for g in CONFIGS]
    return [
        *tiny,
        *mix_domains(),
        *sched_domains(),
        *wide_domains(),
        *ladder_domains(),
        *constraint_domains(),
    ]
