"""One SGLang ``/generate`` body -> validated :class:`GenRequest` s, each checked on its own.

The embedded server (:mod:`.server`) calls :func:`parse_generate` before anything joins a
batch, so a bad request is answered 400 alone and never reaches the engine. The checks mirror
SGLang's own (read at sgl-project/sglang ``00c17caf``):

* ``sampling_params.py`` ``SamplingParams.verify``: temperature a finite number >= 0, top_p in
  (0, 1], max_new_tokens not negative (we need >= 1: every engine here emits at least one
  token), one message per field naming it and the value;
* ``tokenizer_manager.py`` ``_validate_one_request``: a prompt at or past the model's context
  length ("The input (N tokens) is longer than the model's context length (M tokens)"), and
  prompt + max_new_tokens past it ("Requested token count exceeds the model's maximum context
  length ..."), both 400 (SGLang truncates only with ``--allow-auto-truncate``, off by default);
* ``io_struct.py`` ``GenerateReqInput``: exactly one of ``text`` / ``input_ids``; ``text`` is
  tokenised with the served model's tokenizer (``tokenizer.encode(text)``, as SGLang does).

Two checks SGLang does not need but a CPU stand-in does: ``n`` at most the server's batch
(``n`` rows are decoded together) and ``sampling_seed`` in [0, 2**63) (``torch.Generator``
rejects larger ones inside the engine). Unknown top-level or ``sampling_params`` fields are
rejected by the schema (:mod:`.sglang_schema`) with the field named.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from megatron_rl.rollout import sglang_schema
from megatron_rl.rollout.base import Completion, GenRequest, SamplingParams, check_request

_TOP_K_ALL = 1 << 30  # SGLang's "whole vocabulary" top_k
_GREEDY_BELOW = 1e-6  # SGLang's _SAMPLING_EPS: a lower temperature means greedy
_MAX_SEED = 2**63  # torch.Generator.manual_seed takes seeds below this


@dataclass
class Limits:
    """What one request may ask of the served model."""

    vocab_size: int | None  # token ids must be in [0, vocab_size) (None: unchecked)
    context_len: int | None  # prompt + max_new_tokens at most this (None: unchecked)
    max_n: int  # most completions (n) per prompt: the server's batch size
    routed_experts: bool = False  # the engine records routed experts (--enable-return-...)
    max_prompts: int = 1024  # most prompts in one /generate body (a batch of input_ids)
    max_tokens: int = 1 << 22  # most tokens one body may cost: prompts + n x max_new_tokens


@dataclass
class ParsedGenerate:
    """A validated /generate body: one request and rid per prompt."""

    requests: list[GenRequest]
    rids: list[str]
    single: bool  # one prompt given as a flat list / string: answer with one object
    return_logprob: bool
    stream: bool = False  # answer as server-sent events (one chunk per output, then [DONE])
    return_routed_experts: bool = False  # meta_info["routed_experts"] (MoE), as SGLang


def precheck_size(body: Any, limits: Limits) -> None:
    """Reject too many prompts and an over-long ``input_ids`` prompt before the (slow,
    per-item) schema check: a body of millions of tiny prompts costs one ``len`` here."""
    ids = body.get("input_ids") if isinstance(body, dict) else None
    text = body.get("text") if isinstance(body, dict) else None
    batch = ids if isinstance(ids, list) and ids and isinstance(ids[0], list) else text
    if isinstance(batch, list) and len(batch) > limits.max_prompts:
        raise ValueError(
            f"{'input_ids' if batch is ids else 'text'}: {len(batch)} prompts in one request; "
            f"this server takes at most {limits.max_prompts} (--max-prompts-per-request)"
        )
    if limits.context_len is None or not isinstance(ids, list):
        return
    prompts = [ids] if not ids or not isinstance(ids[0], list) else ids
    for i, p in enumerate(prompts):
        if isinstance(p, list) and len(p) >= limits.context_len:
            where = "input_ids" if prompts is not ids else f"input_ids[{i}]"
            raise ValueError(
                f"{where}: the input ({len(p)} tokens) is longer than the model's context "
                f"length ({limits.context_len} tokens)"
            )


def parse_generate(
    body: Any, limits: Limits, tokenize: Callable[[str], list[int]] | None
) -> ParsedGenerate:
    """Validate ``body`` and build its requests; ``ValueError`` names the field (HTTP 400)."""
    precheck_size(body, limits)
    sglang_schema.validate("generate", body)
    sglang_schema.check_supported_generate(body)
    routed = bool(body.get("return_routed_experts"))
    if routed and not limits.routed_experts:
        raise ValueError(
            "return_routed_experts: this server does not record routed experts "
            "(start it as SGLang with --enable-return-routed-experts; here: "
            "rollout.return_routed_experts=true, an MoE model)"
        )
    prompts, single = _prompts(body, tokenize)
    sps = _sampling_params(body, len(prompts))
    rids = _rids(body.get("rid"), len(prompts), single)
    requests = []
    for i, (ids, sp) in enumerate(zip(prompts, sps, strict=True)):
        where = "" if single else f"prompt {i}: "
        try:
            req = to_gen_request(ids, sp, limits.max_n)
            check_request(req, limits.vocab_size, limits.context_len)
        except ValueError as e:
            raise ValueError(f"{where}{e}") from None
        requests.append(req)
    cost = sum(len(r.prompt_ids) + r.params.n * r.params.max_tokens for r in requests)
    if cost > limits.max_tokens:
        raise ValueError(
            f"the request costs {cost} tokens (prompts + n x max_new_tokens); this server "
            f"takes at most {limits.max_tokens} per request (--max-tokens-per-request)"
        )
    return ParsedGenerate(
        requests, rids, single, bool(body.get("return_logprob")), bool(body.get("stream")), routed
    )


def to_gen_request(input_ids: list[int], sp: dict[str, Any], max_n: int = 1 << 20) -> GenRequest:
    """Map SGLang ``sampling_params`` onto our :class:`SamplingParams`; reject what we lack."""
    _check_unsupported(sp)
    _check_ranges(sp, max_n)
    stop = sp.get("stop") or []
    temperature = 1.0 if sp.get("temperature") is None else float(sp["temperature"])
    params = SamplingParams(
        # SGLang samples greedily below 1e-6; dividing logits by a denormal would give inf
        temperature=0.0 if temperature < _GREEDY_BELOW else temperature,
        top_p=1.0 if sp.get("top_p") is None else float(sp["top_p"]),
        max_tokens=128 if sp.get("max_new_tokens") is None else int(sp["max_new_tokens"]),
        stop=[stop] if isinstance(stop, str) else list(stop),
        stop_token_ids=list(sp.get("stop_token_ids") or []),
        seed=sp.get("sampling_seed"),
        n=1 if sp.get("n") is None else int(sp["n"]),
    )
    params.validate()
    return GenRequest(prompt_ids=list(input_ids), params=params)


def _check_unsupported(sp: dict[str, Any]) -> None:
    for key, neutral in (("min_p", 0.0), ("frequency_penalty", 0.0), ("presence_penalty", 0.0)):
        if sp.get(key) not in (None, neutral):
            raise ValueError(f"the embedded server does not support sampling_params.{key}")
    if sp.get("repetition_penalty") not in (None, 1.0):
        raise ValueError("the embedded server does not support sampling_params.repetition_penalty")
    if sp.get("top_k") not in (None, -1, _TOP_K_ALL):
        raise ValueError("the embedded server does not support sampling_params.top_k")
    for key in ("json_schema", "regex", "ebnf", "structural_tag", "stop_regex", "logit_bias"):
        if sp.get(key):
            raise ValueError(f"the embedded server does not support sampling_params.{key}")


def _check_ranges(sp: dict[str, Any], max_n: int) -> None:
    """SGLang's ``SamplingParams.verify`` ranges, with the field and value in the message."""
    t, p = sp.get("temperature"), sp.get("top_p")
    if t is not None and not (t < 2**1000 and math.isfinite(t) and t >= 0):  # JSON ints: any size
        raise ValueError(f"sampling_params.temperature must be a finite number >= 0, got {t}")
    if p is not None and not 0 < p <= 1:
        raise ValueError(f"sampling_params.top_p must be in (0, 1], got {p}")
    m = sp.get("max_new_tokens")
    if m is not None and m < 1:
        raise ValueError(f"sampling_params.max_new_tokens must be >= 1, got {m}")
    n = sp.get("n")
    if n is not None and not 1 <= n <= max_n:
        raise ValueError(f"sampling_params.n must be in [1, {max_n}], got {n}")
    seed = sp.get("sampling_seed")
    if seed is not None and not 0 <= seed < _MAX_SEED:
        raise ValueError(f"sampling_params.sampling_seed must be in [0, 2**63), got {seed}")


def _prompts(
    body: dict[str, Any], tokenize: Callable[[str], list[int]] | None
) -> tuple[list[list[int]], bool]:
    """(token ids per prompt, is_single) from ``input_ids`` or ``text``."""
    text, ids = body.get("text"), body.get("input_ids")
    if (text is None) == (ids is None):
        raise ValueError("/generate needs exactly one of 'text' and 'input_ids'")
    if text is not None:
        if tokenize is None:
            raise ValueError("this server has no tokenizer: send 'input_ids'")
        single = isinstance(text, str)
        texts = [text] if single else list(text)
        if not texts:
            raise ValueError("text is an empty list")
        return [tokenize(t) for t in texts], single
    if not ids:
        raise ValueError("input_ids is empty")
    single = isinstance(ids[0], int)
    return ([ids] if single else ids), single


def _sampling_params(body: dict[str, Any], n_prompts: int) -> list[dict[str, Any]]:
    sp = body.get("sampling_params") or {}
    sps = list(sp) if isinstance(sp, list) else [sp] * n_prompts
    if len(sps) != n_prompts:
        raise ValueError(f"sampling_params: {len(sps)} given for {n_prompts} prompts")
    return sps


def _rids(rid: Any, n_prompts: int, single: bool) -> list[str]:
    if isinstance(rid, list):
        if len(rid) != n_prompts:
            raise ValueError(f"rid: {len(rid)} given for {n_prompts} prompts")
        return list(rid)
    if single:
        return [rid or uuid.uuid4().hex]
    return [f"{rid}-{i}" if rid else uuid.uuid4().hex for i in range(n_prompts)]


# ---- responses --------------------------------------------------------------------------
def completion_to_sglang(
    c: Completion,
    rid: str,
    prompt_len: int,
    return_logprob: bool,
    weight_version: str,
    return_routed_experts: bool = False,
) -> dict[str, Any]:
    """One SGLang ``/generate`` output object for one completion."""
    finish: dict[str, Any]
    if c.finish_reason == "length":
        finish = {"type": "length", "length": len(c.token_ids)}
    elif c.finish_reason == "abort":
        finish = {"type": "abort", "message": "aborted"}
    else:
        finish = {"type": "stop", "matched": c.token_ids[-1] if c.token_ids else None}
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": finish,
        "prompt_tokens": prompt_len,
        "completion_tokens": len(c.token_ids),
        "cached_tokens": 0,
        "weight_version": weight_version,
    }
    if return_logprob:
        meta["output_token_logprobs"] = [
            [float(lp), int(t), None] for lp, t in zip(c.logprobs, c.token_ids, strict=True)
        ]
    if return_routed_experts and c.routed_experts is not None:  # base64 int32, as SGLang
        meta["routed_experts"] = sglang_schema.encode_routed_experts(c.routed_experts)
    return {"text": c.text, "output_ids": list(c.token_ids), "meta_info": meta}


def aborted(n: int) -> list[Completion]:
    return [Completion(token_ids=[], text="", logprobs=[], finish_reason="abort")] * n


async def stream_response(request: web.Request, outs: list[dict[str, Any]]) -> web.StreamResponse:
    """``stream: true`` as SGLang answers it (sglang/srt/entrypoints/http_server.py,
    ``generate_request``): ``text/event-stream`` of ``data: <output JSON>`` events, then
    ``data: [DONE]``. The engine finishes a batch at once, so each output is one event holding
    its whole text, token ids and log-probs (SGLang's last, cumulative chunk)."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for out in outs:
        await resp.write(b"data: " + json.dumps(out).encode() + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


def error_response(status: int, message: str) -> web.Response:
    """SGLang's error body: ``{"error": {"message": ...}}``."""
    return web.json_response({"error": {"message": message}}, status=status)
