"""TP=2 and PP=2 (two CPU processes over gloo, launched with torchrun) match TP=1 / PP=1.

One two-process torchrun launch runs tests/integration/dist/policy_equivalence.py, which goes
through the layouts TP=1/PP=1 (so DP=2), TP=2 and PP=2, all from the same seeded HF-layout weights.
Each saves shared-prefix vs plain packing differences (``shared_prefix_check``), logits, packed
log-probs/entropies, per-micro-batch losses, the grad norm of one optimizer step, and logits + HF
weights after that step (gathered whole, and streamed to rank 0 in small buckets, which must hold
the same tensors). Before the step everything must agree within 1e-5 absolute. After the step,
logits are compared within 1e-5 relative to their magnitude: Adam turns fp32 rounding differences in
the grads (different reduction orders across TP ranks) into parameter differences of ~1e-7, which
larger logits amplify. The DP=2 reference is checked against the same run in this (single) process.

Also here: impossible layouts give one clear ValueError line (pure checks, no processes).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from conftest import tiny_model_config
from launching import torchrun

from megatron_rl.model.config import ParallelConfig
from megatron_rl.model.parallel import validate_layout

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "integration" / "dist" / "policy_equivalence.py"
LAYOUTS = ("ref", "tp2", "pp2")


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """One torchrun launch of two processes runs every layout (see the worker's docstring)."""
    out_dir = tmp_path_factory.mktemp("equivalence")
    torchrun(2, [str(WORKER), "--out-dir", str(out_dir)], timeout=300)
    return {name: torch.load(out_dir / f"{name}.pt", weights_only=True) for name in LAYOUTS}


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return float((a - b).abs().max())


@pytest.mark.parametrize("layout", ["tp2", "pp2"])
def test_parallel_matches_single_process(results: dict[str, dict], layout: str) -> None:
    ref, par = results["ref"], results[layout]
    assert max_diff(ref["logits_before"], par["logits_before"]) < 1e-5
    for key in ("logprobs", "entropy"):
        for a, b in zip(ref[key], par[key], strict=True):
            assert max_diff(a, b) < 1e-5, key
    for m_ref, m_par in zip(ref["metrics"], par["metrics"], strict=True):
        for k in ("loss", "pg", "entropy"):
            assert m_par[k] == pytest.approx(m_ref[k], abs=1e-5), k
    assert par["step"]["grad_norm"] == pytest.approx(ref["step"]["grad_norm"], rel=1e-5)
    scale = float(ref["logits_after"].abs().max())
    assert max_diff(ref["logits_after"], par["logits_after"]) < 1e-5 * max(1.0, scale)
    for name, w in ref["hf_after"].items():
        assert max_diff(w, par["hf_after"][name]) < 1e-5, name


@pytest.mark.parametrize("layout", LAYOUTS)
def test_shared_prefix_equals_plain_packing(results: dict[str, dict], layout: str) -> None:
    """Shared-prefix rows equal plain packing under TP=2 and PP=2 too (tests/prefix_data.py):
    per-sample log-probs / entropies at two temperatures, every parameter's gradient with
    per-token temperatures; every rank's layers ran over each prompt once; and the shared rows'
    log-probs equal the reference layout's."""
    sp, ref = results[layout]["shared_prefix"], results["ref"]["shared_prefix"]
    for t in (0.8, 1.3):
        assert sp[f"lp_diff_{t}"] < 1e-5 and sp[f"ent_diff_{t}"] < 1e-5
        assert max_diff(sp[f"lp_shared_{t}"], ref[f"lp_shared_{t}"]) < 1e-5
    assert sp["grad_diff"] < 1e-5 and sp["grad_abs_sum"] > 0
    assert all(seen == [sp["expected_tokens"]] * 3 for seen in sp["rows_seen"])


def test_two_process_reference_equals_single_process(results: dict[str, dict]) -> None:
    """The reference layout (TP=1, PP=1, DP=2 on identical data) is exactly one process's run."""
    from megatron_rl.model.parallel import destroy_distributed

    spec = importlib.util.spec_from_file_location("policy_equivalence", WORKER)
    assert spec is not None and spec.loader is not None
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    try:
        single = worker.run_layout(1, 1)  # world of one process, torch.distributed in this one
    finally:
        destroy_distributed()
    ref = results["ref"]
    assert ref["dp"] == 2 and single["dp"] == 1
    assert max_diff(single["logits_before"], ref["logits_before"]) < 1e-5
    scale = float(ref["logits_after"].abs().max())
    assert max_diff(single["logits_after"], ref["logits_after"]) < 1e-5 * max(1.0, scale)
    assert single["step"]["grad_norm"] == pytest.approx(ref["step"]["grad_norm"], rel=1e-5)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_export_streams_in_buckets_to_rank_zero(results: dict[str, dict], layout: str) -> None:
    """Small buckets: several per PP stage, each whole layers; together exactly the state dict."""
    res = results[layout]
    buckets, whole = res["hf_small_buckets"], res["hf_after"]
    assert len(buckets) >= 3
    names = [n for b in buckets for n in b]
    assert sorted(names) == sorted(whole) and len(names) == len(set(names))
    for b in buckets:
        for name, t in b.items():
            assert torch.equal(t, whole[name]), name


def test_step_changed_the_model(results: dict[str, dict]) -> None:
    """The after-step comparison has teeth: one step moves logits far more than the tolerance."""
    ref = results["ref"]
    assert max_diff(ref["logits_before"], ref["logits_after"]) > 0.1
    assert ref["step"]["skipped"] == 0.0


@pytest.mark.parametrize(
    ("parallel", "world", "model", "match"),
    [
        (ParallelConfig(tp=2), 3, {}, r"world size 3 is not divisible by .* = 2"),
        (ParallelConfig(tp=4), 4, {"num_attention_heads": 2}, r"tp=4 must divide .*heads=2"),
        (ParallelConfig(tp=2), 2, {"num_query_groups": 1}, r"tp=2 must divide .*groups=1"),
        (ParallelConfig(pp=3), 3, {"num_layers": 2}, r"pp=3 must divide model.num_layers=2"),
        (ParallelConfig(cp=2), 3, {}, r"world size 3 is not divisible .*parallel.cp = 1 \* 1 \* 2"),
        (ParallelConfig(cp=2, pp=2), 4, {}, r"parallel.cp=2 with parallel.pp=2 is not supported"),
        (ParallelConfig(tp=0), 1, {}, r"parallel.tp must be >= 1"),
    ],
)
def test_bad_layout_is_one_clear_line(parallel, world, model, match) -> None:
    if parallel.cp > 1 and parallel.pp > 1 and torch.cuda.is_available():
        pytest.skip("on GPU, CP with PP is Transformer Engine's and allowed")
    with pytest.raises(ValueError, match=match) as err:
        validate_layout(parallel, world, tiny_model_config(**model))
    assert "\n" not in str(err.value)


def test_start_up_rejects_layout_before_starting(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's one layout check (preflight) refuses before any process group exists."""
    from megatron_rl.config import load_config
    from megatron_rl.train.preflight import preflight

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    before = torch.distributed.is_initialized()
    with pytest.raises(ValueError, match="world size 1 is not divisible"):
        preflight(load_config(None, ["parallel.pp=2"]), "rl")
    assert torch.distributed.is_initialized() == before
