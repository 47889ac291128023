"""Domain discovery through the ``megatron_rl.domains`` entry-point group.

Every plugin (ours in ``domains/`` and third-party packages alike) declares an entry point whose
object is a zero-argument callable returning an iterable of :class:`Domain` instances::

    [project.entry-points."megatron_rl.domains"]
    my_plugin = "my_package.domains:domains"

The registry is the one ``dict[name, Domain]`` of the process, built once on first use. A plugin
that fails to import or to build its domains, or that declares a name another plugin already
registered, is recorded as a :class:`PluginError` naming the plugin (and the other plugin, for a
duplicate); its valid domains and every other plugin's domains stay available. Our own plugins
(``domains.*``) load first, then third-party ones in sorted entry-point order, so on a duplicate
the built-in (else the alphabetically first plugin) keeps the name: a package cannot silently
replace a built-in domain's verifier.
"""

from __future__ import annotations

import difflib
import fnmatch
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points

from megatron_rl.domains.alarm import interrupt_after
from megatron_rl.domains.base import Domain

log = logging.getLogger(__name__)
GROUP = "megatron_rl.domains"
BUILTIN = "domains."  # entry points into this repo's domains/ package load first
LOAD_TIMEOUT_S = 60.0  # one plugin's import plus its factory call


@dataclass(frozen=True)
class PluginError:
    """A plugin (entry point) that could not contribute some or all of its domains."""

    plugin: str  # entry point name
    source: str  # "module:attr" of the entry point, or the distribution name
    message: str  # what went wrong

    def __str__(self) -> str:
        return f"domain plugin {self.plugin!r} ({self.source}): {self.message}"


class Registry:
    """Name -> Domain for all installed plugins, plus the errors met while loading them."""

    def __init__(self) -> None:
        self.domains: dict[str, Domain] = {}
        self.errors: list[PluginError] = []
        self._owner: dict[str, str] = {}

    def add(self, plugin: str, source: str, domains: Iterable[Domain]) -> None:
        for d in domains:
            if not isinstance(d, Domain) or not d.name:
                self.errors.append(PluginError(plugin, source, f"returned a non-Domain {d!r}"))
                continue
            bad = _malformed(d)
            if bad:
                self.errors.append(PluginError(plugin, source, f"domain {d.name!r}: {bad}"))
                continue
            if d.name in self.domains:
                other = self._owner[d.name]
                msg = f"domain {d.name!r} is already registered by plugin {other!r}; skipped"
                self.errors.append(PluginError(plugin, source, msg))
                continue
            d.plugin = plugin
            self.domains[d.name] = d
            self._owner[d.name] = plugin

    def load_plugin(self, plugin: str, source: str, load) -> None:
        """Call ``load()`` (-> factory) then the factory; record any failure under ``plugin``.
        On a main thread a plugin that takes over ``LOAD_TIMEOUT_S`` to load is stopped."""
        try:
            stop = f"plugin {plugin!r} did not load within {LOAD_TIMEOUT_S:g} s"
            with interrupt_after(LOAD_TIMEOUT_S, lambda: TimeoutError(stop)):
                factory = load()
                domains = list(factory())
        except Exception as e:
            self.errors.append(
                PluginError(plugin, source, f"failed to load: {type(e).__name__}: {e}")
            )
            return
        self.add(plugin, source, domains)


_REGISTRY: Registry | None = None


def registry(refresh: bool = False) -> Registry:
    """The process-wide registry of installed plugins (built on first call)."""
    global _REGISTRY
    if _REGISTRY is None or refresh:
        reg = Registry()
        eps = entry_points(group=GROUP)
        for ep in sorted(eps, key=lambda e: (not e.value.startswith(BUILTIN), e.name)):
            reg.load_plugin(ep.name, ep.value, ep.load)
        for err in reg.errors:
            log.warning("%s", err)
        _REGISTRY = reg
    return _REGISTRY


def select(
    names: Sequence[str], include: Sequence[str] | None, exclude: Sequence[str]
) -> list[str]:
    """Names matching any ``include`` pattern (all if None) and no ``exclude`` pattern.

    Every pattern must match something; otherwise ``ValueError`` lists the closest names.
    """
    chosen: list[str] = []
    for pat in include if include is not None else ["*"]:
        hits = fnmatch.filter(names, pat)
        if not hits:
            raise ValueError(_no_match("include", pat, names))
        chosen.extend(h for h in hits if h not in chosen)
    for pat in exclude:
        hits = fnmatch.filter(chosen, pat)
        if not hits and not fnmatch.filter(names, pat):
            raise ValueError(_no_match("exclude", pat, names))
        chosen = [c for c in chosen if c not in hits]
    return sorted(chosen)


def _no_match(kind: str, pattern: str, names: Sequence[str]) -> str:
    close = difflib.get_close_matches(pattern, names, n=5, cutoff=0.5)
    families = sorted({n.split("/", 1)[0] + "/*" for n in names})
    hint = f"closest: {close}" if close else f"families: {families}"
    return f"domain {kind} pattern {pattern!r} matches no registered domain; {hint}"


def _malformed(d: Domain) -> str:
    """What makes a domain unusable before any of its code runs (empty: nothing)."""
    levels, splits = getattr(d, "levels", ()), getattr(d, "splits", ())
    if not (isinstance(levels, tuple | list) and levels and all(type(x) is int for x in levels)):
        return f"levels must be a non-empty tuple of ints, got {levels!r}"
    if not (isinstance(splits, tuple | list) and splits and set(splits) <= {"train", "eval"}):
        return f"splits must be a non-empty subset of ('train', 'eval'), got {splits!r}"
    return ""
