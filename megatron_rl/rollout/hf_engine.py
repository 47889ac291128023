"""Reference rollout engine on plain ``transformers``: our own batched sampling loop.

It is the yardstick for the other engines' log-probs and, for very small models on a CPU, often
the faster one (no scheduler, no paged KV cache; see benchmarks/rollout_engines.py).

How a ``generate`` call runs:
1. Requests are packed into chunks of at most ``RolloutConfig.max_batch`` sequences.
2. Prefix sharing: each distinct prompt of a chunk is prefilled once (left-padded batch), then
   the KV cache rows are repeated to its samples (``Cache.batch_select_indices``): a group's
   ``n``, and every request repeating that prompt. A group of 8 costs one prompt forward, not 8,
   whether it comes as one request or as 8 (the SGLang client's form). This is what vLLM's prefix
   cache achieves for a group.
3. Decode one token per step for every live sequence; finished sequences are dropped from the
   batch (and from the cache) once a quarter of the batch has finished, so late steps only pay
   for live rows without copying the cache at every finish.
4. Runs on the GPU when CUDA is available (not yet checked on a GPU), else on the CPU.
5. Sampling per request uses its own ``torch.Generator`` seeded from ``SamplingParams.seed`` (or
   a seed derived from the engine seed), so results do not depend on which other requests share
   the batch, up to floating-point differences of the batched forward.

Log-probs follow the convention in :mod:`megatron_rl.rollout.base`: ``log_softmax(logits / T)``
of the sampled token, renormalised over the nucleus when ``top_p < 1``, untempered when greedy.

Routed experts (MoE models, ``rollout.return_routed_experts``): a forward hook on every layer's
router (``mlp.gate``, which returns the top-k indices) records its choices; each completion gets
its prompt's routing from the prefill and one row per decode step in which it was fed its own
latest token: ``[prompt + completion - 1, L, k]``, as SGLang returns them.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from transformers import AutoModelForCausalLM, AutoTokenizer

from megatron_rl.rollout.base import (
    Completion,
    EngineStartError,
    FinishReason,
    GenRequest,
    RolloutEngine,
    SamplingParams,
    check_requests,
    derive_seed,
    load_hf_dir,
    register_engine,
)

if TYPE_CHECKING:
    from megatron_rl.rollout.config import RolloutConfig


# Finished rows are dropped from the batch (and its KV cache) once at most this fraction of the
# batch is still live; until then they ride along, which is cheaper than copying the cache.
_COMPACT_AT = 0.75


@dataclass
class _Row:
    """One sequence being generated: which request it belongs to and what it produced so far."""

    request: int  # index of its request within the chunk
    params: SamplingParams
    end_ids: set[int]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: FinishReason | None = None
    text: str | None = None  # set when a stop string cut it
    routes: list[Tensor] = field(default_factory=list)  # [n, L, k] chunks (routed experts)


class _RouteRecorder:
    """Forward hooks on an HF MoE model's routers; :meth:`take` returns the last forward's
    choices ``[N, L, k]`` (N: the batch's tokens, batch-major)."""

    def __init__(self, model: Any) -> None:
        layers = getattr(getattr(model, "model", None), "layers", None) or []
        gates: list[Any] = [getattr(getattr(x, "mlp", None), "gate", None) for x in layers]
        if not gates or any(g is None or not hasattr(g, "top_k") for g in gates):
            raise ValueError(
                "rollout.return_routed_experts=true needs an MoE model whose every "
                "layer has a top-k router (mlp.gate), e.g. Qwen3-MoE"
            )
        self._last: list[Tensor | None] = [None] * len(gates)
        for i, gate in enumerate(gates):
            gate.register_forward_hook(self._hook(i))

    def _hook(self, i: int) -> Any:
        def save(module: Any, args: Any, out: Any) -> None:
            self._last[i] = out[2].detach()  # (logits, weights, indices)

        return save

    def take(self) -> Tensor:
        assert all(t is not None for t in self._last), "a router did not run"
        out = torch.stack(self._last, dim=1).to("cpu", torch.int32)  # type: ignore[arg-type]
        self._last = [None] * len(self._last)
        return out


def nucleus_filter(scaled_logits: Tensor, top_p: float) -> Tensor:
    """Set logits outside the top-p nucleus to -inf. ``scaled_logits``: [B, V] -> [B, V]."""
    probs = torch.softmax(scaled_logits, dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    # Keep a token if the mass strictly before it is below top_p (the top token is always kept).
    drop_sorted = (sorted_probs.cumsum(dim=-1) - sorted_probs) >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return scaled_logits.masked_fill(drop, float("-inf"))


def sample_tokens(
    logits: Tensor, params: SamplingParams, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """Sample one token per row. ``logits``: [B, V] fp32 -> (tokens [B], logprobs [B])."""
    if params.temperature == 0:
        tokens = logits.argmax(dim=-1)
        logp = torch.log_softmax(logits, dim=-1)
    else:
        scaled = logits / params.temperature
        if params.top_p < 1:
            scaled = nucleus_filter(scaled, params.top_p)
        logp = torch.log_softmax(scaled, dim=-1)
        tokens = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


@register_engine("hf")
class HFEngine(RolloutEngine):
    """``transformers`` model in this process; see the module docstring."""

    def __init__(self, cfg: RolloutConfig, model_dir: str, seed: int) -> None:
        self.cfg = cfg
        self.seed = seed
        self._calls = 0
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
            self.model = AutoModelForCausalLM.from_pretrained(
                model_dir, dtype=getattr(torch, cfg.dtype)
            ).eval()
            self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            self.model.to(self.device)
        except (OSError, ValueError, KeyError) as e:
            raise EngineStartError(
                f"rollout engine 'hf' could not load the model in {model_dir!r}: {e}"
            ) from e
        self.vocab_size = int(self.model.get_input_embeddings().num_embeddings)
        positions = getattr(self.model.config, "max_position_embeddings", None)
        self.context_len = int(positions) if positions else None
        self.eos_ids = _eos_ids(self.tokenizer.eos_token_id, self.model.generation_config)
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad) if pad is not None else min(self.eos_ids, default=0)
        self.routed_experts = cfg.return_routed_experts
        self._routes: _RouteRecorder | None = None
        if self.routed_experts:
            try:
                self._routes = _RouteRecorder(self.model)
            except ValueError as e:
                raise EngineStartError(f"rollout engine 'hf' on {model_dir!r}: {e}") from e

    # ------------------------------------------------------------------------------------------
    # generation

    def generate(self, requests: list[GenRequest]) -> list[list[Completion]]:
        check_requests(requests, self.vocab_size, self.context_len)
        seeds = [
            r.params.seed if r.params.seed is not None else derive_seed(self.seed, self._calls, i)
            for i, r in enumerate(requests)
        ]
        self._calls += 1
        results: list[list[Completion]] = [[] for _ in requests]
        computed = 0  # prompt tokens prefilled: each distinct prompt once per chunk
        for chunk in self._chunks(requests):
            outs = self._generate_chunk([requests[i] for i in chunk], [seeds[i] for i in chunk])
            for i, out in zip(chunk, outs, strict=True):
                results[i] = out
            computed += sum(len(p) for p in {tuple(requests[i].prompt_ids) for i in chunk})
        prompt = [len(r.prompt_ids) * r.params.n for r in requests]
        self.stats = {
            "rollout/prompt_tokens": float(sum(prompt)),
            "rollout/cached_prompt_tokens": float(sum(prompt) - computed),
            "rollout/generated_tokens": float(sum(len(c.token_ids) for cs in results for c in cs)),
        }
        return results

    def _chunks(self, requests: list[GenRequest]) -> list[list[int]]:
        """Indices of requests packed so that each chunk holds <= max_batch sequences."""
        chunks: list[list[int]] = [[]]
        rows = 0
        for i, req in enumerate(requests):
            if chunks[-1] and rows + req.params.n > self.cfg.max_batch:
                chunks.append([])
                rows = 0
            chunks[-1].append(i)
            rows += req.params.n
        return [c for c in chunks if c]

    @torch.inference_mode()
    def _generate_chunk(self, reqs: list[GenRequest], seeds: list[int]) -> list[list[Completion]]:
        rows = [
            _Row(g, r.params, self.eos_ids | set(r.params.stop_token_ids))
            for g, r in enumerate(reqs)
            for _ in range(r.params.n)
        ]
        # Prefix sharing: one prefill per distinct prompt, KV rows repeated for every sample
        # of it (a group's n samples, and requests that repeat a prompt: the SGLang client
        # sends each sample of a group as its own request).
        unique: dict[tuple[int, ...], int] = {}
        of_request = [unique.setdefault(tuple(r.prompt_ids), len(unique)) for r in reqs]
        logits, cache, attn, pos = self._prefill([list(p) for p in unique])
        if self._routes is not None:
            prompt_routes = self._prompt_routes([list(p) for p in unique])
            for row in rows:
                row.routes.append(prompt_routes[of_request[row.request]])
        expand = torch.tensor([of_request[row.request] for row in rows], device=self.device)
        cache.batch_select_indices(expand)
        logits, attn, pos = logits[expand], attn[expand], pos[expand]
        gens = [torch.Generator(device=self.device).manual_seed(s) for s in seeds]
        batch = list(range(len(rows)))  # row ids in batch order (finished rows may linger)
        while True:
            live = [k for k, i in enumerate(batch) if rows[i].finish is None]
            idx = torch.tensor(live, device=self.device)
            tokens = torch.full((len(batch),), self.pad_id, dtype=torch.long, device=self.device)
            tokens[idx] = self._sample_step(logits[idx], [rows[batch[k]] for k in live], gens)
            keep = [k for k, i in enumerate(batch) if rows[i].finish is None]
            if not keep:
                break
            if len(keep) <= _COMPACT_AT * len(batch):  # dropping rows copies the whole cache
                idx = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(idx)
                tokens, attn, pos = tokens[idx], attn[idx], pos[idx]
                batch = [batch[k] for k in keep]
            attn = torch.cat([attn, attn.new_ones(len(batch), 1)], dim=1)
            pos = pos + 1
            out = self.model(
                input_ids=tokens[:, None],
                attention_mask=attn,
                position_ids=pos[:, None],
                past_key_values=cache,
                use_cache=True,
            )
            logits, cache = out.logits[:, -1].float(), out.past_key_values
            if self._routes is not None:  # each live row was fed its own latest token
                step = self._routes.take()
                for k, i in enumerate(batch):
                    if rows[i].finish is None:
                        rows[i].routes.append(step[k : k + 1])
        return self._completions(rows, len(reqs))

    def _prompt_routes(self, prompts: list[list[int]]) -> list[Tensor]:
        """Each prompt's routing in the (left-padded) prefill that just ran: ``[len, L, k]``."""
        assert self._routes is not None
        width = max(len(p) for p in prompts)
        routes = self._routes.take().view(len(prompts), width, *self._routes_shape())
        return [routes[g, width - len(p) :] for g, p in enumerate(prompts)]

    def _routes_shape(self) -> tuple[int, int]:
        cfg = self.model.config
        return int(cfg.num_hidden_layers), int(cfg.num_experts_per_tok)

    def _prefill(self, prompts: list[list[int]]) -> tuple[Tensor, Any, Tensor, Tensor]:
        """Left-padded prompt forward -> (last logits [G, V], cache, mask [G, L], last pos [G])."""
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(prompts), width), dtype=torch.long)
        for g, p in enumerate(prompts):
            ids[g, width - len(p) :] = torch.tensor(p)
            attn[g, width - len(p) :] = 1
        ids, attn = ids.to(self.device), attn.to(self.device)
        pos = (attn.cumsum(dim=1) - 1).clamp(min=0)
        out = self.model(
            input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True, logits_to_keep=1
        )
        return out.logits[:, -1].float(), out.past_key_values, attn, pos[:, -1]

    def _sample_step(self, logits: Tensor, rows: list[_Row], gens: list[torch.Generator]) -> Tensor:
        """Sample the next token of every live row (``logits``: [A, V]); update the rows."""
        tokens = torch.empty(len(rows), dtype=torch.long, device=self.device)
        by_request: dict[int, list[int]] = {}
        for k, row in enumerate(rows):
            by_request.setdefault(row.request, []).append(k)
        for g, ks in by_request.items():
            idx = torch.tensor(ks, device=self.device)
            tok, logp = sample_tokens(logits[idx], rows[ks[0]].params, gens[g])
            tokens[idx] = tok
            for k, t, lp in zip(ks, tok.tolist(), logp.tolist(), strict=True):
                self._append(rows[k], t, lp)
        return tokens

    def _append(self, row: _Row, token: int, logprob: float) -> None:
        row.tokens.append(token)
        row.logprobs.append(logprob)
        if token in row.end_ids:
            row.finish = "stop"
        elif row.params.stop and (cut := self._find_stop(row)) is not None:
            row.finish, row.text = "stop", cut
        elif len(row.tokens) >= row.params.max_tokens:
            row.finish = "length"

    def _find_stop(self, row: _Row) -> str | None:
        """The text before the earliest stop string, or None if no stop string occurs yet."""
        text = self._decode(row.tokens)
        hits = [i for s in row.params.stop if (i := text.find(s)) >= 0]
        return text[: min(hits)] if hits else None

    def _decode(self, tokens: list[int]) -> str:
        return str(self.tokenizer.decode(tokens, skip_special_tokens=True))

    def _completions(self, rows: list[_Row], num_requests: int) -> list[list[Completion]]:
        out: list[list[Completion]] = [[] for _ in range(num_requests)]
        for row in rows:
            assert row.finish is not None
            text = row.text if row.text is not None else self._decode(row.tokens)
            routes = torch.cat(row.routes) if self._routes is not None else None
            out[row.request].append(Completion(row.tokens, text, row.logprobs, row.finish, routes))
        return out

    # ------------------------------------------------------------------------------------------
    # weights

    def update_weights(self, hf_state_dict: dict[str, Tensor]) -> float:
        start = time.perf_counter()
        own = self.model.state_dict()
        hf_state_dict = fuse_experts(hf_state_dict, own)
        unexpected = sorted(set(hf_state_dict) - set(own))
        missing = set(own) - set(hf_state_dict)
        if self.model.config.tie_word_embeddings:
            missing.discard("lm_head.weight")
        if unexpected or missing:
            raise ValueError(
                f"hf engine: weight names do not match the model: unexpected {unexpected[:5]}, "
                f"missing {sorted(missing)[:5]}"
            )
        with torch.no_grad():
            for name, tensor in hf_state_dict.items():
                if own[name].shape != tensor.shape:
                    raise ValueError(
                        f"hf engine: {name} has shape {tuple(tensor.shape)}, "
                        f"model expects {tuple(own[name].shape)}"
                    )
                own[name].copy_(tensor)
        return time.perf_counter() - start

    def update_weights_from_disk(self, hf_dir: str) -> float:
        start = time.perf_counter()
        self.update_weights(load_hf_dir(hf_dir, engine="hf"))
        return time.perf_counter() - start

    def shutdown(self) -> None:
        self.model = None


_EXPERT = re.compile(r"(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight")


def fuse_experts(sd: dict[str, Tensor], own: dict[str, Tensor]) -> dict[str, Tensor]:
    """Per-expert HF tensors -> the fused layout transformers 5 keeps an MoE in memory.

    Checkpoints (and the trainer's export) hold ``...experts.{e}.gate_proj/up_proj/down_proj``;
    the loaded model holds ``...experts.gate_up_proj`` ``[E, 2F, H]`` (each expert's gate rows,
    then its up rows) and ``...experts.down_proj`` ``[E, H, F]``. Other tensors pass unchanged.
    """
    out: dict[str, Tensor] = {}
    parts: dict[str, dict[tuple[int, str], Tensor]] = {}
    for name, t in sd.items():
        m = _EXPERT.fullmatch(name)
        if m and f"{m[1]}.gate_up_proj" in own:
            parts.setdefault(m[1], {})[(int(m[2]), m[3])] = t
        else:
            out[name] = t
    for prefix, p in parts.items():
        n = own[f"{prefix}.gate_up_proj"].shape[0]
        missing = [
            f"{prefix}.{e}.{w}.weight"
            for e in range(n)
            for w in ("gate_proj", "up_proj", "down_proj")
            if (e, w) not in p
        ]
        if missing:
            raise ValueError(f"hf engine: missing expert weight(s) {missing[:3]}")
        gate_up = [torch.cat([p[(e, "gate_proj")], p[(e, "up_proj")]]) for e in range(n)]
        out[f"{prefix}.gate_up_proj"] = torch.stack(gate_up)
        out[f"{prefix}.down_proj"] = torch.stack([p[(e, "down_proj")] for e in range(n)])
    return out


def _eos_ids(tokenizer_eos: int | None, generation_config: object) -> set[int]:
    """EOS ids from the tokenizer and the model's generation config (which may list several)."""
    ids = {int(tokenizer_eos)} if tokenizer_eos is not None else set()
    extra = getattr(generation_config, "eos_token_id", None)
    if isinstance(extra, int):
        ids.add(extra)
    elif isinstance(extra, list):
        ids.update(int(e) for e in extra)
    return ids
