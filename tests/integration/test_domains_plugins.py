"""Discovery end to end: separate packages installed with pip add (or break) domains.

The fixture packages in ``tests/integration/plugins/`` are pip-installed into a temporary
``--target`` directory (a real pip install of a real wheel, kept out of the shared venv) which the
CLI subprocesses get on ``PYTHONPATH``; entry points are then found exactly as for a package
installed into site-packages.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PLUGINS = Path(__file__).parent / "plugins"
CLI = [sys.executable, "-m", "launch.cli"]


def _pip_install(target: Path, *packages: str) -> None:
    for name in packages:  # build from a copy: no build/ or egg-info left in the repo
        shutil.copytree(PLUGINS / name, target.parent / "src" / name)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "--target",
        str(target),
        *(str(target.parent / "src" / n) for n in packages),
    ]
    subprocess.run(cmd, check=True, timeout=300)


def _cli(target: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # `check` records prompt-space sizes in the cache directory: keep it beside the packages
    env = {**os.environ, "PYTHONPATH": str(target), "XDG_CACHE_HOME": str(target.parent)}
    return subprocess.run(
        [*CLI, "domains", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=Path(__file__).parent.parent.parent,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("plugins") / "site"
    _pip_install(target, "mrl_extra_domains", "mrl_bad_plugins")
    return target


def test_third_party_package_appears_in_list(site):
    res = _cli(site, "list", "--json", "extra/*", "dupe/*", "math/linear_equation", "rg/gcd@0")
    assert res.returncode == 0, res.stderr
    entries = {e["name"]: e for e in json.loads(res.stdout)}
    assert entries["extra/reverse_word"]["plugin"] == "extra"
    assert entries["extra/reverse_word"]["difficulty"] == [1, 2]
    # the duplicate name stays with the built-in plugin; the dupe plugin's other domain works
    assert entries["math/linear_equation"]["plugin"] == "math"
    assert entries["dupe/echo"]["plugin"] == "dupe"
    assert "rg/gcd@0" in entries
    # both bad plugins are reported by name, once each
    assert res.stderr.count("domain plugin 'broken'") == 1
    assert "No module named 'mrl_dependency_that_is_not_installed'" in res.stderr
    assert "plugin 'dupe'" in res.stderr and "already registered by plugin 'math'" in res.stderr


def test_check_runs_third_party_domain_and_fails_on_plugin_errors(site):
    res = _cli(site, "check", "extra/*", "--samples", "2")
    assert "ok   extra/reverse_word" in res.stdout, res.stdout + res.stderr
    assert "1/1 domains pass the contract; 2 plugin error(s)" in res.stdout
    assert res.returncode == 1


def test_unknown_domain_is_one_line_error(site):
    res = _cli(site, "show", "extra/revers_word")
    assert res.returncode == 2
    assert "closest: ['extra/reverse_word'" in res.stderr
    assert "Traceback" not in res.stderr
