"""The CPU compat layer: targets still exist (fails loudly after a megatron-core upgrade that
makes a patch stale), apply() is idempotent, and each redirection does what its docstring says."""

from __future__ import annotations

import importlib

import pytest
import torch

from megatron_rl.model import compat

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="compat is a no-op with CUDA")


def test_every_patch_target_still_exists() -> None:
    problems = compat.check_targets()
    assert problems == [], "megatron-core changed; update megatron_rl/model/compat.py: " + str(
        problems
    )


def test_apply_is_idempotent_and_reports_active() -> None:
    assert compat.apply() is True
    proxy = importlib.import_module("megatron.core.optimizer.clip_grads").torch
    assert compat.apply() is True
    assert compat.is_active()
    assert importlib.import_module("megatron.core.optimizer.clip_grads").torch is proxy


def test_proxy_redirects_cuda_to_cpu() -> None:
    compat.apply()
    mt = importlib.import_module("megatron.core.pipeline_parallel.schedules").torch
    assert mt.zeros([], dtype=torch.int, device="cuda").device.type == "cpu"
    assert mt.tensor([1.0], device="cuda:1").device.type == "cpu"
    assert mt.empty(3, device=mt.cuda.current_device()).device.type == "cpu"
    assert mt.cuda.synchronize() is None
    assert mt.float32 is torch.float32 and mt.Tensor is torch.Tensor  # everything else forwards


def test_buffer_and_clip_replacements_behave(dist1) -> None:
    compat.apply()
    from megatron.core.optimizer import clip_grads
    from megatron.core.utils import GlobalMemoryBuffer

    buf = GlobalMemoryBuffer().get_tensor((2, 3), torch.float32, "x")
    assert buf.shape == (2, 3) and buf.device.type == "cpu"
    params = [torch.nn.Parameter(torch.zeros(2)) for _ in range(2)]
    params[0].grad, params[1].grad = torch.tensor([3.0, 0.0]), torch.tensor([0.0, 4.0])
    clip_grads.clip_grad_by_total_norm_fp32(params, max_norm=1.0, total_norm=5.0)
    assert torch.allclose(params[0].grad, torch.tensor([0.6, 0.0]), atol=1e-6)
    clip_grads.clip_grad_by_total_norm_fp32(params, max_norm=10.0, total_norm=1.0)
    assert torch.allclose(params[1].grad, torch.tensor([0.0, 0.8]), atol=1e-6)  # no upscaling
    # the grad-norm path allocates with device="cuda" internally; it runs on CPU now
    norm = clip_grads.get_grad_norm_fp32([p.grad for p in params])
    assert norm == pytest.approx(1.0, abs=1e-6)


def test_stale_target_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(compat.REPLACED, ("megatron.core.utils", "no_such_function"), ())
    monkeypatch.setattr(
        compat, "PROXIED_MODULES", (*compat.PROXIED_MODULES, "megatron.core.no_such_module")
    )
    problems = compat.check_targets()
    assert any("no_such_function" in p for p in problems)
    assert any("no_such_module" in p for p in problems)


def test_moe_patches_behave() -> None:
    """The MoE layer's CPU patches: the dispatcher's side stream and events are no-ops, its split
    sizes come back as numpy arrays (``all_to_all_single`` refuses tensors), and the TE-only
    names the router tests against None exist."""
    compat.apply()
    from megatron.core.transformer.moe import moe_utils, token_dispatcher

    mt = token_dispatcher.torch
    stream = mt.cuda.Stream()
    with mt.cuda.stream(stream):
        stream.wait_stream(mt.cuda.current_stream())
    stream.record_event().synchronize()
    for mod in (moe_utils, token_dispatcher):
        out = mod.maybe_move_tensor_to_cpu(torch.tensor([3, 1]), as_numpy=True)
        assert type(out).__name__ == "ndarray" and out.tolist() == [3, 1]
        t = torch.tensor([2])
        assert mod.maybe_move_tensor_to_cpu(t) is t
    assert moe_utils.te_general_gemm is None
