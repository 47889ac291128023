"""The rollout engine interface: prompts in, sampled completions with per-token log-probs out.

Every engine (``hf`` reference, embedded ``vllm``, remote ``sglang``) implements
:class:`RolloutEngine` and registers itself in :data:`ENGINES` with :func:`register_engine`;
:func:`build_engine` picks one by ``RolloutConfig.engine``.

Log-prob convention (the trainer must compute exactly the same quantity):
``Completion.logprobs[i]`` is the log-prob of ``token_ids[i]`` under the distribution the token
was sampled from, ``log_softmax(logits / T)`` for temperature ``T > 0``. With ``top_p < 1`` the
distribution is the nucleus renormalised (tokens outside the nucleus have probability 0), so
the trainer can only reproduce it if it applies the same nucleus; RL runs use ``top_p = 1``
(config load refuses ``rollout.top_p < 1``).
With ``T == 0`` (greedy) the log-prob is that of the untempered ``log_softmax(logits)``.

A completion ends at the tokenizer's EOS or a ``stop_token_ids`` token (that token is part of
``token_ids`` and ``logprobs``: the policy chose it, so it is trained), at a stop string
(``finish_reason='stop'``; ``text`` ends before the stop string, ``token_ids`` keep the token
that completed it) or after ``max_tokens`` tokens (``finish_reason='length'``).

Requests without a seed get one derived from the engine seed and a call counter, so a whole
run is reproducible from ``RunConfig.seed``.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from torch import Tensor

    from megatron_rl.rollout.config import RolloutConfig

FinishReason = Literal["stop", "length", "abort"]


@dataclass
class SamplingParams:
    """How one request is sampled. ``n`` completions share the prompt (a GRPO group)."""

    temperature: float = 1.0  # softmax temperature; 0 means greedy
    top_p: float = 1.0  # nucleus mass kept, (0, 1]
    max_tokens: int = 64  # most generated tokens per completion
    stop: list[str] = field(default_factory=list)  # stop strings (not included in text)
    stop_token_ids: list[int] = field(default_factory=list)  # extra end tokens besides EOS
    seed: int | None = None  # sampling seed (None: derived from the engine seed)
    n: int = 1  # completions per request

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first field out of range (NaN and inf included)."""
        if self.n < 1:
            raise ValueError(f"SamplingParams.n must be >= 1, got {self.n}")
        if self.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens must be >= 1, got {self.max_tokens}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(
                f"SamplingParams.temperature must be a finite number >= 0, got {self.temperature}"
            )
        if not 0 < self.top_p <= 1:  # also rejects NaN
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")


@dataclass
class GenRequest:
    """One prompt (already tokenized) and how to sample it; ``tag`` travels back untouched."""

    prompt_ids: list[int]
    params: SamplingParams
    tag: Any = None


@dataclass
class Completion:
    """One sampled completion: ``len(token_ids) == len(logprobs)``.

    ``routed_experts`` (MoE models, engines started with ``rollout.return_routed_experts``): the
    experts the engine chose for every token it ran, ``[len(prompt) + len(token_ids) - 1, L, k]``
    int32 (the prompt's tokens, then every sampled token but the last, which the engine never
    fed back), in SGLang's and vLLM's convention. None otherwise.
    """

    token_ids: list[int]
    text: str
    logprobs: list[float]
    finish_reason: FinishReason
    routed_experts: Tensor | None = None


class EngineStartError(RuntimeError):
    """An engine could not start; the message names the engine, the model and the cause."""


class RolloutEngine(ABC):
    """Generates completions and takes new weights (HF parameter names) from the trainer.

    After each ``generate`` call, ``stats`` holds that call's token counts for the tracker:
    ``rollout/prompt_tokens`` (prompt tokens times n), ``rollout/cached_prompt_tokens`` (of
    those, served from a shared prefix instead of recomputed) and ``rollout/generated_tokens``.
    """

    stats: dict[str, float] = {}  # replaced (never mutated) by each generate call
    routed_experts: bool = False  # completions carry ``routed_experts`` (set by the engine)
    vocab_size: int = 0  # token ids must be in [0, vocab_size) (local engines set it)
    context_len: int | None = None  # most positions, prompt + completion (None: unknown)

    @abstractmethod
    def generate(self, requests: list[GenRequest]) -> list[list[Completion]]:
        """Return, for each request in order, its ``params.n`` completions."""

    @abstractmethod
    def update_weights(self, hf_state_dict: dict[str, Tensor]) -> float:
        """Load new weights in HF layout; return the seconds it took."""

    @abstractmethod
    def update_weights_from_disk(self, hf_dir: str) -> float:
        """Load new weights from ``*.safetensors`` files in ``hf_dir``; return the seconds."""

    def shutdown(self) -> None:  # noqa: B027 - engines without resources need nothing here
        """Release the engine's memory and processes. Safe to call twice."""


def derive_seed(base_seed: int, call_index: int, request_index: int) -> int:
    """A deterministic 31-bit seed for the ``request_index``-th request of a ``generate`` call."""
    x = (base_seed * 1_000_003 + call_index) * 1_000_033 + request_index
    x ^= x >> 17
    x = (x * 0x5BD1E995) & 0xFFFFFFFFFFFF
    return int(x % (2**31 - 1))


def check_request(req: GenRequest, vocab_size: int | None, context_len: int | None = None) -> None:
    """Raise ``ValueError`` naming what makes this one request impossible for the model.

    Checked before a request joins a batch, so that a bad one fails alone: sampling parameters
    in range, a non-empty prompt of token ids in ``[0, vocab_size)``, and prompt plus
    ``max_tokens`` within ``context_len`` (the model's positions). None: not checked.
    """
    req.params.validate()
    if not req.prompt_ids:
        raise ValueError("empty prompt: input_ids is []")
    if vocab_size is not None:
        for name, ids in (
            ("input_ids", req.prompt_ids),
            ("stop_token_ids", req.params.stop_token_ids),
        ):
            bad = [t for t in ids if not 0 <= t < vocab_size]
            if bad:
                raise ValueError(f"{name} has token ids outside [0, {vocab_size}): {bad[:5]}")
    if context_len is not None:
        total = len(req.prompt_ids) + req.params.max_tokens
        if len(req.prompt_ids) >= context_len:
            raise ValueError(
                f"the input ({len(req.prompt_ids)} tokens) is longer than the model's context "
                f"length ({context_len} tokens)"
            )
        if total > context_len:
            raise ValueError(
                f"requested token count exceeds the model's context length of {context_len} "
                f"tokens: {len(req.prompt_ids)} prompt tokens + max_new_tokens="
                f"{req.params.max_tokens}"
            )


def check_requests(
    requests: list[GenRequest], vocab_size: int, context_len: int | None = None
) -> None:
    """Raise ``ValueError`` naming the first request that no engine could run."""
    for i, req in enumerate(requests):
        try:
            check_request(req, vocab_size, context_len)
        except ValueError as e:
            raise ValueError(f"request {i} (tag={req.tag!r}): {e}") from None


def load_hf_dir(hf_dir: str, engine: str) -> dict[str, Tensor]:
    """All tensors of the ``*.safetensors`` files in ``hf_dir`` (HF parameter names)."""
    from safetensors.torch import load_file

    files = sorted(Path(hf_dir).glob("*.safetensors"))
    if not files:
        raise ValueError(f"rollout engine {engine!r}: no *.safetensors files in {hf_dir!r}")
    state: dict[str, Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


ENGINES: dict[str, type[RolloutEngine]] = {}

# Modules that register built-in engines; imported on first use so that importing the
# interface never pulls in vLLM. A module that is not present (yet) is skipped.
_BUILTIN_ENGINE_MODULES = (
    "megatron_rl.rollout.hf_engine",
    "megatron_rl.rollout.vllm_engine",
    "megatron_rl.rollout.sglang_client",
)


def register_engine(name: str) -> Callable[[type[RolloutEngine]], type[RolloutEngine]]:
    """Class decorator: ``@register_engine("hf")`` adds the class to :data:`ENGINES`."""

    def deco(cls: type[RolloutEngine]) -> type[RolloutEngine]:
        if name in ENGINES and ENGINES[name] is not cls:
            raise ValueError(f"rollout engine {name!r} is registered twice")
        ENGINES[name] = cls
        return cls

    return deco


def load_builtin_engines() -> None:
    """Import the built-in engine modules so that they register themselves."""
    for module in _BUILTIN_ENGINE_MODULES:
        if importlib.util.find_spec(module) is not None:
            importlib.import_module(module)


def engine_class(cfg: RolloutConfig) -> type[RolloutEngine]:
    """The registered engine class named by ``cfg.engine`` (``build.build_engine`` starts it)."""
    load_builtin_engines()
    if cfg.engine not in ENGINES:
        raise ValueError(
            f"rollout.engine={cfg.engine!r} is not a registered engine; "
            f"choose one of {sorted(ENGINES)}"
        )
    return ENGINES[cfg.engine]
