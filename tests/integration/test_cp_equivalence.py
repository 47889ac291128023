"""CP=2 on CPU (two gloo processes under torchrun) computes what CP=1 computes (issue 17).

The worker (tests/integration/dist/cp_equivalence.py) runs the policy under CP=1 (two data-parallel
replicas of the same data, i.e. one process's run) and CP=2 in Megatron/TE's load-balanced THD
layout (megatron-core ``utils.get_thd_batch_on_this_cp_rank`` / TE ``thd_get_partitioned_indices``:
each packed sequence padded to a multiple of 2 * cp, rank r holding chunks r and 2cp-1-r), with
``long_context/cp_attention.py`` as the core attention. Packed micro-batches mix sequence lengths
that are not multiples of 4 (so every sequence carries padding) and one of 41 tokens, far longer
than a chunk. Required (fp32): logits, packed log-probs / entropies and every parameter gradient
within 1e-5; after two RL steps through ``rl_step.train_step`` the weights within 1e-5.

With four processes the same worker also checks CP=2 x DP=2, CP=2 x TP=2 and CP=4 (marked slow).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from launching import torchrun

from megatron_rl.packing.batch import PackedBatch

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "integration" / "dist" / "cp_equivalence.py"


def launch(out_dir: Path, nproc: int, layouts: str) -> dict[str, dict]:
    """One torchrun launch of ``nproc`` CPU processes; returns each layout's saved results."""
    torchrun(nproc, [str(WORKER), "--out-dir", str(out_dir), "--layouts", layouts], timeout=600)
    # the results hold PackedBatch rows besides tensors: that one class allow-listed, no other
    with torch.serialization.safe_globals([PackedBatch]):
        return {n: torch.load(out_dir / f"{n}.pt", weights_only=True) for n in layouts.split(",")}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    return launch(tmp_path_factory.mktemp("cp"), 2, "ref,cp2,cp2switch")


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return float((a - b).abs().max())


def check_equal(ref: dict, par: dict) -> None:
    assert max_diff(ref["logits"], par["logits"]) < 1e-5
    assert max_diff(ref["one_short"], par["one_short"]) < 1e-5
    for key in ("logprobs", "entropy"):
        for a, b in zip(ref[key], par[key], strict=True):
            assert max_diff(a, b) < 1e-5, key
    for m_ref, m_par in zip(ref["metrics"], par["metrics"], strict=True):
        assert m_par["loss"] == pytest.approx(m_ref["loss"], abs=1e-5)
    assert ref["grads"].keys() == par["grads"].keys()
    for name, g in ref["grads"].items():
        assert max_diff(g, par["grads"][name]) < 1e-5, name
    for s_ref, s_par in zip(ref["rl"], par["rl"], strict=True):
        assert s_par["loss/total"] == pytest.approx(s_ref["loss/total"], abs=1e-5)
        assert s_par["train/grad_norm"] == pytest.approx(s_ref["train/grad_norm"], rel=1e-5)
        assert s_par["train/skipped_steps"] == 0.0
    for name, w in ref["hf_after"].items():
        assert max_diff(w, par["hf_after"][name]) < 1e-5, name


def test_cp2_matches_cp1(results: dict[str, dict]) -> None:
    ref, cp2 = results["ref"], results["cp2"]
    assert (ref["cp"], ref["dp"], cp2["cp"], cp2["dp"]) == (1, 2, 2, 1)
    check_equal(ref, cp2)


def test_length_switched_cp2_matches_cp1(results: dict[str, dict]) -> None:
    """parallel.cp_min_tokens=20: micro-batches of short sequences run whole on one CP rank each
    (rank 1 owns none in the one-batch call), the one with 41 tokens is split; logits, log-probs,
    grads and two RL steps equal CP=1 as the plain CP=2 run does."""
    ref, sw = results["ref"], results["cp2switch"]
    assert (sw["cp"], sw["dp"]) == (2, 1)
    check_equal(ref, sw)


def test_cp2_shared_prefix_equals_plain_packing(results: dict[str, dict]) -> None:
    """Shared-prefix rows under CP=2 (each segment split over both ranks, prefixes included)
    give the log-probs, entropies and gradients of plain packing at CP=1 (and at CP=2)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from prefix_data import compare_per_sample

    ref, cp2 = results["ref"]["shared_prefix"], results["cp2"]["shared_prefix"]
    plain, shared = ref["plain"]["batch"], ref["shared"]["batch"]
    assert shared.shared_prefix and shared.num_tokens < plain.num_tokens
    for key in ("lp", "ent"):
        assert compare_per_sample(plain, shared, ref["plain"][key], cp2["shared"][key],
                                  ref["plens"]) < 1e-5  # fmt: skip
        assert max_diff(ref["shared"][key], cp2["shared"][key]) < 1e-5
    for name, g in ref["plain"]["grads"].items():
        assert max_diff(g, cp2["shared"]["grads"][name]) < 1e-5, name
        assert max_diff(g, ref["shared"]["grads"][name]) < 1e-5, name
    assert sum(float(g.abs().sum()) for g in ref["plain"]["grads"].values()) > 0


def test_cp_padding_is_masked_out(results: dict[str, dict]) -> None:
    """Every sequence of the batches is padded under CP=2; changing the pad tokens changes no
    log-prob and no gradient, so the padding is out of the loss (and out of the attention)."""
    cp2 = results["cp2"]
    for a, b in zip(cp2["logprobs"], cp2["poisoned_pads"]["logprobs"], strict=True):
        assert max_diff(a, b) == 0.0
    for name, g in cp2["grads"].items():
        assert max_diff(g, cp2["poisoned_pads"]["grads"][name]) == 0.0, name


def test_cp_ranks_with_different_batches_refuse(results: dict[str, dict]) -> None:
    assert "ranks got different micro-batches" in results["cp2"]["different_batches_error"]


def test_comparison_has_teeth(results: dict[str, dict]) -> None:
    """Gradients are far from zero and the two RL steps move the weights far beyond 1e-5."""
    ref = results["ref"]
    assert max(float(g.abs().max()) for g in ref["grads"].values()) > 1e-2
    spec = importlib.util.spec_from_file_location("cp_equivalence", WORKER)
    assert spec is not None and spec.loader is not None
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    start = worker.reference_weights(worker.CFG, seed=0)
    moved = max(max_diff(w, start[n]) for n, w in ref["hf_after"].items())
    assert moved > 1e-3


@pytest.mark.slow
def test_cp2_with_dp2_and_tp2_and_cp4_match_cp1(tmp_path: Path) -> None:
    """Four processes: CP=2 x DP=2, CP=2 x TP=2 and CP=4 against the CP=1 reference (DP=4)."""
    got = launch(tmp_path, 4, "ref,cp2,cp2tp2,cp4")
    assert (got["cp2"]["cp"], got["cp2"]["dp"]) == (2, 2)
    assert (got["cp2tp2"]["cp"], got["cp2tp2"]["dp"]) == (2, 1)
    assert (got["cp4"]["cp"], got["cp4"]["dp"]) == (4, 1)
    for name in ("cp2", "cp2tp2", "cp4"):
        check_equal(got["ref"], got[name])
