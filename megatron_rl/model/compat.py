"""Make megatron-core run on a CPU over gloo when CUDA is absent.

megatron-core assumes a GPU in a handful of places that the training path (model build, pipeline
schedules, DDP, optimizer, grad clipping) goes through. On a machine without CUDA, :func:`apply`
installs the patches below; with CUDA it does nothing. It is idempotent, and :func:`is_active`
says whether the layer is on (``megatron-rl info`` prints it).

How: instead of patching ``torch`` globally (which would change behaviour for every library in
the process, vLLM included), each patched megatron-core module gets its module-global ``torch``
name rebound to :class:`_TorchOnCpu`, a thin proxy that forwards every attribute to the real
``torch`` except:

* ``torch.cuda.current_device()`` -> ``torch.device("cpu")``. Megatron passes it as ``device=``
  to ``torch.empty`` etc. (p2p communication, ``GlobalMemoryBuffer.get_tensor``, TP mappings,
  DDP grad buffers, the fp32 optimizer's dummy tensors).
* ``torch.cuda.synchronize()`` / ``torch.cuda.empty_cache()`` -> no-ops (p2p, DDP);
  ``torch.cuda.current_stream()`` / ``default_stream()`` / ``Stream()`` -> a stream whose waits
  and events are no-ops, ``torch.cuda.stream(s)`` -> a null context (0.19.x DDP waits on
  CUDA-graph events before every grad sync; the MoE dispatcher copies its split sizes to the
  host on a side stream).
* tensor factories (``empty``, ``zeros``, ``ones``, ``full``, ``tensor``, ``arange``, ...) map a
  ``device="cuda"`` (or ``cuda:N`` / int) argument to the CPU: the literals in the pipeline
  schedules' token counter, the optimizer's ``found_inf``/``_scale_one`` buffers, grad-norm and
  zero counting in ``clip_grads``, and the attention-mask helpers.

Names that a module imports from Transformer Engine and later tests against ``None`` are
undefined without TE (``TE_ONLY_NAMES``: the MoE router's ``te_general_gemm``); they are set to
``None``, which selects megatron-core's own plain-torch branch.

Some functions are replaced outright because the problem is not a device argument:

* ``clip_grads.clip_grad_by_total_norm_fp32`` asserts ``grad.type() == 'torch.cuda.FloatTensor'``.
  The replacement scales the same grads by the same coefficient (max_norm / (norm + 1e-6) when
  that is < 1) without the assertion. It is rebound in ``optimizer.optimizer`` too, which imported
  the name directly.
* ``moe_utils.maybe_move_tensor_to_cpu`` (rebound in ``token_dispatcher`` too) turns the MoE
  dispatcher's split sizes into numpy arrays only when they are CUDA tensors; on CPU they stayed
  tensors, which ``all_to_all_single`` refuses. The replacement returns numpy for CPU tensors too.
* ``tensor_parallel.random._get_cuda_rng_state`` / ``_set_cuda_rng_state`` read/write the CUDA
  generator (activation recomputation saves and restores it). On CPU there is no CUDA generator:
  get returns an empty byte tensor and set ignores it; the CPU generator state is still saved and
  restored by megatron's own code path next to it.

Not covered (GPU-only features): sequence parallelism (needs Apex/TE), CUDA graphs, fp16/bf16
mixed-precision optimizers (their ``'torch.cuda.HalfTensor'`` type checks), communication
overlap streams, tied embeddings with PP > 1 (``weight.data.cuda()``). Context parallelism runs
on CPU without a patch: its attention is ``megatron_rl/model/cp/attention.py`` (TE's on GPU).

Versions: checked on CPU with megatron-core 0.16.1 (Python 3.11, the normal install) and 0.19.2
(installed with ``--ignore-requires-python``): the compat, policy and TP/PP equivalence tests pass
on both.

Staleness: every patch names its target; :func:`check_targets` verifies each target module and
attribute still exists and, for the replaced functions, that the signature still has the
parameters we rely on. ``tests/unit/test_compat.py`` runs it and fails loudly after an upgrade. The
end-to-end tests (PP=2, optimizer steps) exercise the patched paths for real.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

# Modules whose ``torch`` global is swapped for the CPU proxy.
PROXIED_MODULES: tuple[str, ...] = (
    "megatron.core.utils",
    "megatron.core.pipeline_parallel.schedules",
    "megatron.core.pipeline_parallel.p2p_communication",
    "megatron.core.distributed.distributed_data_parallel",
    "megatron.core.distributed.param_and_grad_buffer",
    "megatron.core.distributed.finalize_model_grads",
    "megatron.core.optimizer.optimizer",
    "megatron.core.optimizer.clip_grads",
    "megatron.core.optimizer.distrib_optimizer",
    "megatron.core.tensor_parallel.layers",
    "megatron.core.tensor_parallel.mappings",
    "megatron.core.tensor_parallel.random",
    "megatron.core.tensor_parallel.cross_entropy",
    "megatron.core.transformer.utils",
    "megatron.core.models.common.embeddings.rotary_pos_embedding",
    # the MoE layer: router (weights moved to current_device), experts, the dispatcher's
    # device-to-host side stream, the aux-loss tracker's device="cuda" buffers
    "megatron.core.transformer.moe.router",
    "megatron.core.transformer.moe.experts",
    "megatron.core.transformer.moe.shared_experts",
    "megatron.core.transformer.moe.token_dispatcher",
    "megatron.core.transformer.moe.moe_utils",
)

# (module, attribute) pairs replaced by a CPU version, with the parameters the original must have.
REPLACED: dict[tuple[str, str], tuple[str, ...]] = {
    ("megatron.core.optimizer.clip_grads", "clip_grad_by_total_norm_fp32"): (
        "parameters",
        "max_norm",
        "total_norm",
    ),
    ("megatron.core.optimizer.optimizer", "clip_grad_by_total_norm_fp32"): (
        "parameters",
        "max_norm",
        "total_norm",
    ),
    ("megatron.core.tensor_parallel.random", "_get_cuda_rng_state"): ("device",),
    ("megatron.core.tensor_parallel.random", "_set_cuda_rng_state"): ("new_state",),
    ("megatron.core.transformer.moe.moe_utils", "maybe_move_tensor_to_cpu"): (
        "tensor",
        "as_numpy",
        "record_stream",
    ),
    ("megatron.core.transformer.moe.token_dispatcher", "maybe_move_tensor_to_cpu"): (
        "tensor",
        "as_numpy",
        "record_stream",
    ),
}

# Names a module imports only when Transformer Engine does, then tests against None; without TE
# they are undefined (megatron-core 0.16.1: the MoE router's gating GEMM raises NameError on
# ``te_general_gemm``). Defined as None when missing, which selects the plain-torch branches.
TE_ONLY_NAMES: dict[str, tuple[str, ...]] = {
    "megatron.core.transformer.moe.moe_utils": (
        "te_general_gemm",
        "fused_compute_score_for_moe_aux_loss",
        "fused_moe_aux_loss",
        "fused_permute",
        "fused_permute_with_probs",
        "fused_sort_chunks_by_index",
        "fused_sort_chunks_by_index_with_probs",
        "fused_topk_with_score_function",
        "fused_unpermute",
    ),
}

_FACTORIES = (
    "empty",
    "zeros",
    "ones",
    "full",
    "tensor",
    "as_tensor",
    "arange",
    "rand",
    "randn",
    "randint",
    "empty_like",
    "zeros_like",
    "ones_like",
    "full_like",
)

_state = {"active": False}


def _cpu_device(device: Any) -> Any:
    """Map a CUDA device spec (``"cuda"``, ``"cuda:1"``, int, torch.device) to the CPU."""
    if isinstance(device, int) or (isinstance(device, str) and device.startswith("cuda")):
        return torch.device("cpu")
    if isinstance(device, torch.device) and device.type == "cuda":
        return torch.device("cpu")
    return device


def _on_cpu(fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if "device" in kwargs:
            kwargs["device"] = _cpu_device(kwargs["device"])
        return fn(*args, **kwargs)

    wrapper.__name__ = getattr(fn, "__name__", "factory")
    return wrapper


class _NoStream:
    """What ``current_stream()`` / ``Stream()`` give on CPU: every wait is already satisfied."""

    def wait_event(self, event: Any) -> None:
        return None

    def wait_stream(self, stream: Any) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def record_event(self, event: Any = None) -> _NoStream:
        return self  # an "event" whose synchronize() returns at once


class _CudaOnCpu:
    """Stands in for ``torch.cuda`` inside patched megatron modules."""

    @staticmethod
    def current_stream(device: Any = None) -> _NoStream:
        return _NoStream()

    @staticmethod
    def default_stream(device: Any = None) -> _NoStream:
        return _NoStream()

    @staticmethod
    def Stream(*args: Any, **kwargs: Any) -> _NoStream:  # named like torch.cuda.Stream
        return _NoStream()

    @staticmethod
    def stream(stream: Any) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

    @staticmethod
    def current_device() -> torch.device:
        return torch.device("cpu")

    @staticmethod
    def synchronize(device: Any = None) -> None:
        return None

    @staticmethod
    def empty_cache() -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cuda, name)


class _TorchOnCpu:
    """Forwards to ``torch``; ``cuda`` and tensor factories are redirected to the CPU."""

    cuda = _CudaOnCpu()

    def __init__(self) -> None:
        for name in _FACTORIES:
            setattr(self, name, _on_cpu(getattr(torch, name)))

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


def _clip_grad_by_total_norm_cpu(
    parameters: Any, max_norm: float, total_norm: float, use_decoupled_grad: bool = False
) -> None:
    """Scale grads in place by max_norm / (total_norm + 1e-6) when that is below 1."""
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    attr = "decoupled_grad" if use_decoupled_grad else "grad"
    grads = [getattr(p, attr) for p in parameters if getattr(p, attr, None) is not None]
    clip_coeff = max_norm / (total_norm + 1.0e-6)
    if clip_coeff < 1.0:
        for g in grads:
            g.detach().mul_(clip_coeff)


def _get_cuda_rng_state_cpu(
    device: Any = "cuda", clone: bool = False, graph_safe: bool = False
) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8)


def _set_cuda_rng_state_cpu(new_state: Any, device: int = -1, graph_safe: bool = False) -> None:
    return None


def _maybe_move_tensor_to_cpu_cpu(
    tensor: Any, as_numpy: bool = False, record_stream: bool = False
) -> Any:
    """The tensor on the host, as a numpy array when asked (a CPU tensor included)."""
    if isinstance(tensor, torch.Tensor) and as_numpy:
        return tensor.detach().cpu().numpy()
    return tensor


_REPLACEMENTS: dict[str, Callable[..., Any]] = {
    "maybe_move_tensor_to_cpu": _maybe_move_tensor_to_cpu_cpu,
    "clip_grad_by_total_norm_fp32": _clip_grad_by_total_norm_cpu,
    "_get_cuda_rng_state": _get_cuda_rng_state_cpu,
    "_set_cuda_rng_state": _set_cuda_rng_state_cpu,
}


def check_targets() -> list[str]:
    """Return a list of problems: patch targets that vanished or changed shape (empty: all ok)."""
    problems = []
    for name in PROXIED_MODULES:
        try:
            mod = importlib.import_module(name)
        except ImportError as e:
            problems.append(f"{name}: cannot import ({e})")
            continue
        if not isinstance(mod.__dict__.get("torch"), (ModuleType, _TorchOnCpu)):
            problems.append(f"{name}: has no module-global 'torch' to redirect")
    for name in TE_ONLY_NAMES:
        try:
            importlib.import_module(name)
        except ImportError as e:
            problems.append(f"{name}: cannot import ({e})")
    for (name, attr), params in REPLACED.items():
        mod = importlib.import_module(name)
        fn = getattr(mod, attr, None)
        if fn is None:
            problems.append(f"{name}.{attr}: no longer exists")
            continue
        original = getattr(fn, "__megatron_rl_original__", fn)
        have = set(inspect.signature(original).parameters)
        missing = [p for p in params if p not in have]
        if missing:
            problems.append(f"{name}.{attr}: parameters {missing} are gone")
    return problems


def apply() -> bool:
    """Install the CPU patches if CUDA is absent. Idempotent. Returns :func:`is_active`."""
    if torch.cuda.is_available() or _state["active"]:
        return _state["active"]
    problems = check_targets()
    if problems:
        raise RuntimeError(
            "megatron_rl.model.compat: megatron-core changed, CPU patches are stale: "
            + "; ".join(problems)
        )
    proxy = _TorchOnCpu()
    for name in PROXIED_MODULES:
        importlib.import_module(name).torch = proxy  # type: ignore[attr-defined]
    for name, attr in REPLACED:
        mod = importlib.import_module(name)
        replacement = _REPLACEMENTS[attr]
        replacement.__megatron_rl_original__ = getattr(mod, attr)  # type: ignore[attr-defined]
        setattr(mod, attr, replacement)
    for name, attrs in TE_ONLY_NAMES.items():
        mod = importlib.import_module(name)
        for attr in attrs:
            if not hasattr(mod, attr):
                setattr(mod, attr, None)
    _state["active"] = True
    return True


def is_active() -> bool:
    """True when the CPU compat layer is installed in this process."""
    return _state["active"]
