"""Code rewards when no sandbox can run (issue 52): an error verdict that the run counts where it
counts every failed verification, never a pass, unless ``rewards.allow_unsandboxed`` is true.

The sandbox is made unimportable in this process (``sys.modules`` entry set to None, as a broken
install would leave it) or unavailable (``isolation.check_available`` raising, as on a machine
without bubblewrap); everything else is real: the code domain, the guard and its counters, the
unsandboxed subprocess fallback and, where it runs, the real sandbox.
"""

from __future__ import annotations

import functools
import logging
import sys
from pathlib import Path

import pytest

from megatron_rl.config import load_config
from megatron_rl.controller.admission import admit
from megatron_rl.domains import code_exec, load_domains
from megatron_rl.domains.config import DomainsConfig
from megatron_rl.domains.guard import DomainGuard
from megatron_rl.domains.workers import DomainWorkers
from megatron_rl.model.tokenizer import load_tokenizer
from megatron_rl.sandbox import SandboxUnavailable, isolation
from megatron_rl.train.preflight import check_model

PROGRAM = "def f(x):\n    return x + 1\n"
TESTS = "def test_f():\n    assert f(1) == 2\n"
DOMAIN = "code/fn_sum_multiples"
DEMO = "configs/demo_cpu.yaml"


@pytest.fixture(autouse=True)
def fresh_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts from the default (no unsandboxed runs) and logs its first failure."""
    monkeypatch.setitem(code_exec._settings, "allow_unsandboxed", False)
    monkeypatch.setattr(code_exec, "_warned", set())


@pytest.fixture
def unimportable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "megatron_rl.sandbox", None)


@pytest.fixture
def unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_bwrap() -> None:
        raise SandboxUnavailable("bubblewrap (bwrap) is not installed (made so by the test)")

    monkeypatch.setattr(isolation, "check_available", no_bwrap)


@pytest.fixture(scope="module")
def guard() -> DomainGuard:
    return DomainGuard(DomainWorkers(0), DomainsConfig())


def test_unimportable_sandbox_is_an_error_verdict_not_a_pass(unimportable, caplog) -> None:
    with caplog.at_level(logging.ERROR, logger=code_exec.__name__):
        res = code_exec.run_tests(PROGRAM, TESTS)
        again = code_exec.run_tests(PROGRAM, TESTS)
    assert isinstance(res, code_exec.ExecResult)
    assert res.status == again.status == "error"
    assert res.sandbox_error.startswith("the sandbox cannot be imported: ModuleNotFoundError")
    assert res.stderr.startswith("sandbox unavailable:")
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "allow_unsandboxed" in errors[0].getMessage()  # once a process


def test_no_sandbox_is_counted_as_a_verify_error_and_never_rewarded(unimportable, guard) -> None:
    domain = load_domains([DOMAIN])[DOMAIN]
    task = domain.task("train", 0, level=1)
    direct = domain.verify(task, task.gold)  # the verdict itself: score 0, the reason kept
    assert direct.score == 0.0 and direct.details["status"] == "error"
    assert direct.error.startswith("no sandbox: the sandbox cannot be imported")
    before = guard.health.metrics()
    verdicts = guard.verify([(task, task.gold), (task, task.gold)])
    after = guard.health.metrics()
    assert verdicts == [None, None]  # the run drops the group: no made-up reward
    key = f"health/{DOMAIN}/verify_error"
    assert after[key] - before.get(key, 0) == 2
    assert after["health/failures"] - before["health/failures"] == 2
    assert "cannot be imported" in guard.health.last[DOMAIN]


def test_sandbox_unavailable_is_an_error_verdict_too(unavailable) -> None:
    res = code_exec.run_tests(PROGRAM, TESTS)
    assert res.status == "error" and isinstance(res, code_exec.ExecResult)
    assert res.sandbox_error.startswith("SandboxUnavailable: bubblewrap")


def test_allow_unsandboxed_runs_the_fallback_and_warns(unimportable, caplog, monkeypatch) -> None:
    monkeypatch.setenv("MRL_TRAINER_SECRET", "do-not-leak")
    code_exec.configure(allow_unsandboxed=True)
    with caplog.at_level(logging.WARNING, logger=code_exec.__name__):
        passing = code_exec.run_tests(PROGRAM, TESTS)
        failing = code_exec.run_tests("def f(x):\n    return x\n", TESTS)
        no_env = code_exec.run_tests(
            "import os\nseen = sorted(os.environ)\n",
            "def test_env():\n    assert 'MRL_TRAINER_SECRET' not in seen, seen\n",
        )
    assert (passing.status, failing.status, no_env.status) == ("passed", "failed", "passed")
    assert passing.sandbox_error == "" and isinstance(passing, code_exec.ExecResult)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 3 and all("UNSANDBOXED" in w for w in warnings)  # on every call


def test_allow_unsandboxed_reaches_the_sandboxs_own_unsandboxed_mode(unavailable) -> None:
    code_exec.configure(allow_unsandboxed=True)
    res = code_exec.run_tests(PROGRAM, TESTS)
    assert res.status == "passed" and res.sandboxed is False  # type: ignore[union-attr]
    assert code_exec.run_tests(PROGRAM, TESTS, allow_unsandboxed=False).status == "error"


def test_with_the_sandbox_the_gold_passes_and_nothing_is_counted(guard) -> None:
    try:
        isolation.check_available()
    except SandboxUnavailable as e:
        pytest.skip(f"no sandbox on this machine: {e}")
    domain = load_domains([DOMAIN])[DOMAIN]
    task = domain.task("train", 1, level=1)
    before = guard.health.metrics()["health/failures"]
    [verdict] = guard.verify([(task, task.gold)])
    assert verdict is not None and verdict.score == 1.0 and verdict.error == ""
    assert guard.health.metrics()["health/failures"] == before


def test_domain_workers_run_the_runs_setup_in_every_worker(tmp_path: Path) -> None:
    mark = tmp_path / "setup-ran"
    setup = functools.partial(Path.write_text, mark, "yes")
    with DomainWorkers(1, setup=setup):  # a spawned worker: setup runs there, not here
        assert mark.read_text() == "yes"
    mark.unlink()
    DomainWorkers(0, setup=setup).close()  # inline: here
    assert mark.read_text() == "yes"


@pytest.mark.parametrize("allow", [False, True])
def test_the_runs_rewards_allow_unsandboxed_reaches_the_code_verifier(unimportable, allow) -> None:
    overrides = [f"domains.include=[{DOMAIN}]", "domains.workers=0"]
    cfg = load_config(DEMO, [*overrides, f"rewards.allow_unsandboxed={str(allow).lower()}"])
    model = check_model(cfg)
    fit = admit(cfg, model, load_tokenizer(model.hf_path))  # the run's start-up, as train_rl
    guard = DomainGuard(fit.workers, cfg.domains, fit.limit)
    task = fit.domains[DOMAIN].task("train", 0, level=1)
    [verdict] = guard.verify([(task, task.gold)])
    guard.close()
    if allow:  # the unsandboxed fallback ran the gold: a real verdict
        assert verdict is not None and verdict.score == 1.0
    else:  # no sandbox: a counted failure, no verdict
        assert verdict is None and guard.health.metrics()[f"health/{DOMAIN}/verify_error"] == 1
