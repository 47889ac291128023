"""JSON schemas of the SGLang-native HTTP endpoints megatron-rl uses, derived from SGLang's source.

SGLang itself needs a GPU (its CPU backend wants AVX-512/AMX), so its request dataclasses cannot
be imported here. These schemas were written by reading SGLang's own definitions instead:

* ``python/sglang/srt/managers/io_struct.py`` at sgl-project/sglang commit ``001067ff``
  (``GenerateReqInput``, ``FlushCacheReqInput``, ``AbortReq``, ``UpdateWeightFromDiskReqInput``,
  ``InitWeightsUpdateGroupReqInput``, ``UpdateWeightsFromDistributedReqInput``, their outputs;
  ``DestroyWeightsUpdateGroupReqInput`` and ``GetWeightsByNameReqInput``, read in the newer
  ``io_struct.py`` of the stored snapshot);
* ``python/sglang/srt/sampling/sampling_params.py`` at commit ``00c17caf``
  (``SamplingParams``: API fields only; the internal ``stop_strs``, ``is_normalized``... are not
  accepted on the wire);
* the ``/generate`` response: ``{"text", "output_ids", "meta_info"}`` where ``meta_info`` holds
  ``id``, ``finish_reason`` (``{"type": "length", "length": n}``, ``{"type": "stop",
  "matched": token_id | str | null}`` or ``{"type": "abort", "message": ...}``),
  ``prompt_tokens``, ``completion_tokens``, ``cached_tokens`` and, with ``return_logprob``,
  ``output_token_logprobs`` as ``[logprob, token_id, text | null]`` triples;
* routed experts (MoE): ``GenerateReqInput.return_routed_experts`` (io_struct.py), honoured by a
  server started with ``--enable-return-routed-experts`` (``server_args.py``), answers
  ``meta_info["routed_experts"]``: base64 of the int32 array ``[prompt + completion - 1,
  num_hidden_layers, num_experts_per_tok]`` (``layers/moe/routed_experts_capturer.py`` keeps
  one int32 row per KV slot; slime decodes it with ``np.frombuffer(..., np.int32)`` and that
  reshape, ``slime/rollout/sglang_rollout.py``).

SGLang's releases at the time were in the 0.5.x line (``version.py`` read ``0.5.3rc2`` in the
stored snapshot); fields newer than our use are listed so that a real SGLang request validates.

Two deliberate differences from SGLang:

* ``GenerateReqInput`` accepts any subset of its fields; we mark as *used* only those the
  embedded server implements and reject requests that set the others to a non-default value
  (:data:`UNSUPPORTED_GENERATE_FIELDS`), so a client relying on them fails loudly on a laptop
  rather than silently on a cluster.
* sglang-router 0.3.2 forwards ``/generate`` bodies with an extra ``"model": null``; that key is
  accepted too.

Log-prob convention: SGLang's ``output_token_logprobs`` are ``log_softmax(logits / T)`` (after
temperature, before top-k/top-p) unless the server runs with ``SGLANG_RETURN_ORIGINAL_LOGPROB``;
that is exactly :mod:`megatron_rl.rollout.base`'s convention for ``top_p == 1``, so nothing is
converted. Launch SGLang without that variable.
"""

from __future__ import annotations

from typing import Any

import jsonschema

SGLANG_SOURCE = (
    "sglang 0.5.23 io_struct.py / sampling_params.py (tests/integration/test_sglang_io_struct.py)"
)

_INT = {"type": "integer"}
_NUM = {"type": "number"}
_BOOL = {"type": "boolean"}
_STR = {"type": "string"}
_NULL = {"type": "null"}
_ANY: dict[str, Any] = {}


def _opt(*schemas: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [*schemas, _NULL]}


def _list(item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": item}


def _obj(props: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": props,
        "required": list(required),
        "additionalProperties": False,
    }


# SamplingParams API fields (sampling_params.py); internal fields are not accepted.
SAMPLING_PARAMS = _obj(
    {
        "max_new_tokens": _opt(_INT),
        "stop": _opt(_STR, _list(_STR)),
        "stop_token_ids": _opt(_list(_INT)),
        "stop_regex": _opt(_STR, _list(_STR)),
        "temperature": _opt(_NUM),
        "top_p": _opt(_NUM),
        "top_k": _opt(_INT),
        "min_p": _opt(_NUM),
        "frequency_penalty": _opt(_NUM),
        "presence_penalty": _opt(_NUM),
        "repetition_penalty": _opt(_NUM),
        "min_new_tokens": _opt(_INT),
        "n": _opt(_INT),
        "json_schema": _opt(_STR),
        "regex": _opt(_STR),
        "ebnf": _opt(_STR),
        "structural_tag": _opt(_STR),
        "ignore_eos": _opt(_BOOL),
        "skip_special_tokens": _opt(_BOOL),
        "spaces_between_special_tokens": _opt(_BOOL),
        "no_stop_trim": _opt(_BOOL),
        "custom_params": _opt({"type": "object"}),
        "stream_interval": _opt(_INT),
        "logit_bias": _opt({"type": "object", "additionalProperties": _NUM}),
        "sampling_seed": _opt(_INT),
    }
)

_IDS = {"anyOf": [_list(_INT), _list(_list(_INT))]}
_ONE_OR_MANY = lambda s: {"anyOf": [s, _list(s), _NULL]}

# GenerateReqInput: every field SGLang accepts (values of fields we do not use are unchecked).
_GENERATE_USED = {
    "rid": _ONE_OR_MANY(_STR),
    "text": _ONE_OR_MANY(_STR),
    "input_ids": {"anyOf": [_IDS, _NULL]},
    "sampling_params": {"anyOf": [SAMPLING_PARAMS, _list(SAMPLING_PARAMS), _NULL]},
    "return_logprob": _ONE_OR_MANY(_BOOL),
    "logprob_start_len": _ONE_OR_MANY(_INT),
    "top_logprobs_num": _ONE_OR_MANY(_INT),
    "return_text_in_logprobs": _BOOL,
    "stream": _BOOL,
    "log_metrics": _BOOL,
    "model": _opt(_STR),  # added by sglang-router 0.3.2; not a GenerateReqInput field
    "return_routed_experts": _BOOL,
}
_GENERATE_OTHER = (
    "session_id input_embeds image_data video_data audio_data mm_hashes mm_content_hashes "
    "use_audio_in_video video_config token_ids_logprob return_sampling_mask "
    "return_flat_raw_top_logprobs return_flat_raw_top_logprobs_b64 return_hidden_states "
    "routed_experts_start_len return_indexer_topk modalities "
    "session_params lora_path lora_id custom_logit_processor positional_embed_overrides "
    "bootstrap_host bootstrap_port bootstrap_room bootstrap_pair_key decode_tp_size "
    "routed_dp_rank data_parallel_rank disagg_prefill_dp_rank routing_key "
    "conversation_id http_worker_ipc background require_reasoning max_thinking_tokens priority "
    "extra_key no_logs custom_labels return_bytes return_entropy return_prompt_token_ids "
    "external_trace_header received_time need_wait_for_mm_inputs num_items_assigned "
    "encoder_urls max_dynamic_patch min_dynamic_patch image_max_dynamic_patch kv_hints "
    "mm_processor_kwargs return_flat_raw_output_top_logprobs sampling_logprobs_mode "
    "token_indices_to_pool watermark "
    "video_max_dynamic_patch images_config multi_item_delimiter_indices cache_salt"
).split()
GENERATE_REQUEST = _obj({**_GENERATE_USED, **{k: _ANY for k in _GENERATE_OTHER}})

# Fields the embedded server does not implement: accepted only at a falsy/None value.
UNSUPPORTED_GENERATE_FIELDS = (
    "input_embeds image_data video_data audio_data token_ids_logprob return_hidden_states "
    "lora_path custom_logit_processor session_params return_entropy return_sampling_mask"
).split()

_FINISH_REASON = {
    "anyOf": [
        _NULL,
        {
            "type": "object",
            "properties": {"type": {"enum": ["length", "stop", "abort"]}},
            "required": ["type"],
        },
    ]
}
_LOGPROB_TRIPLE = {
    "type": "array",
    "prefixItems": [_NUM, _INT, _opt(_STR)],
    "minItems": 3,
    "maxItems": 3,
}
_GENERATE_ONE = {
    "type": "object",
    "properties": {
        "text": _STR,
        "output_ids": _list(_INT),
        "meta_info": {
            "type": "object",
            "properties": {
                "id": _STR,
                "finish_reason": _FINISH_REASON,
                "prompt_tokens": _INT,
                "completion_tokens": _INT,
                "cached_tokens": _INT,
                "output_token_logprobs": _list(_LOGPROB_TRIPLE),
                "weight_version": _opt(_STR),
            },
            "required": ["id", "finish_reason", "prompt_tokens", "completion_tokens"],
        },
    },
    "required": ["text", "output_ids", "meta_info"],
}
# A single request returns one object; a batch (or n > 1) returns a list of them.
GENERATE_RESPONSE = {"anyOf": [_GENERATE_ONE, _list(_GENERATE_ONE)]}

_SUCCESS = _obj({"success": _BOOL, "message": _STR, "num_paused_requests": _INT}, ("success",))

SCHEMAS: dict[str, dict[str, Any]] = {
    "generate": GENERATE_REQUEST,
    "generate.response": GENERATE_RESPONSE,
    "flush_cache": _obj({"timeout_s": _opt(_NUM), "rid": _opt(_STR)}),
    "abort_request": _obj(
        {
            "rid": _opt(_STR),
            "abort_all": _BOOL,
            "finished_reason": _opt({"type": "object"}),
            "abort_message": _opt(_STR),
            "weight_versions": _ANY,  # 0.5.23: abort only requests of these versions
        }
    ),
    "update_weights_from_disk": _obj(
        {
            "model_path": _STR,
            "load_format": _opt(_STR),
            "abort_all_requests": _BOOL,
            "weight_version": _opt(_STR),
            "is_async": _BOOL,
            "torch_empty_cache": _BOOL,
            "keep_pause": _BOOL,
            "recapture_cuda_graph": _BOOL,
            "token_step": _INT,
            "flush_cache": _BOOL,
            "manifest": _opt({"type": "object"}),
        },
        ("model_path",),
    ),
    "init_weights_update_group": _obj(
        {
            "master_address": _STR,
            "master_port": _INT,
            "rank_offset": _INT,
            "world_size": _INT,
            "group_name": _STR,
            "backend": _STR,
        },
        ("master_address", "master_port", "rank_offset", "world_size"),
    ),
    "update_weights_from_distributed": _obj(
        {
            "names": _list(_STR),
            "dtypes": _list(_STR),
            "shapes": _list(_list(_INT)),
            "group_name": _STR,
            "flush_cache": _BOOL,
            "abort_all_requests": _BOOL,
            "weight_version": _opt(_STR),
            "load_format": _opt(_STR),
            "selector": _ANY,  # 0.5.23: which weights of a multi-model server (unchecked)
            "torch_empty_cache": _BOOL,
        },
        ("names", "dtypes", "shapes"),
    ),
    "destroy_weights_update_group": _obj({"group_name": _STR}),
    "get_weights_by_name": _obj({"name": _STR, "truncate_size": _INT}, ("name",)),
    "success.response": _SUCCESS,
}


_VALIDATORS: dict[str, Any] = {}  # kind -> compiled validator (the schema is checked once)


def _validator(kind: str) -> Any:
    """The compiled validator of ``kind``: ``jsonschema.validate`` would re-check the schema
    itself on every call (~150 ms for GENERATE_REQUEST), once per /generate request."""
    if kind not in _VALIDATORS:
        cls = jsonschema.validators.validator_for(SCHEMAS[kind])
        cls.check_schema(SCHEMAS[kind])
        _VALIDATORS[kind] = cls(SCHEMAS[kind])
    return _VALIDATORS[kind]


def validate(kind: str, body: Any) -> None:
    """Raise ``ValueError`` if ``body`` does not conform to SGLang's schema for ``kind``.

    ``kind`` is an endpoint name without the slash (``"generate"``) or ``"<name>.response"``.
    """
    if kind not in SCHEMAS:
        raise ValueError(f"no SGLang schema named {kind!r}; known: {sorted(SCHEMAS)}")
    error = jsonschema.exceptions.best_match(_validator(kind).iter_errors(body))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "<body>"
        msg = f"{kind} body does not match SGLang's schema at {where}: {error.message}"
        raise ValueError(msg)


def check_supported_generate(body: dict[str, Any]) -> None:
    """Raise ``ValueError`` naming a GenerateReqInput field the embedded server cannot honour."""
    for key in UNSUPPORTED_GENERATE_FIELDS:
        if body.get(key):
            raise ValueError(f"the embedded server does not support {key!r} in /generate")


def encode_routed_experts(routes: Any) -> str:
    """``meta_info["routed_experts"]``: base64 of the int32 ``[tokens - 1, layers, top-k]``."""
    import base64

    import torch

    raw = torch.as_tensor(routes).to(torch.int32).contiguous().numpy().tobytes()
    return base64.b64encode(raw).decode("ascii")


def decode_routed_experts(meta: dict[str, Any], rows: int, shape: tuple[int, int]) -> Any:
    """The int32 tensor ``[rows, layers, top-k]`` of ``meta_info["routed_experts"]``."""
    import base64

    import numpy as np
    import torch

    raw = meta.get("routed_experts")
    if not isinstance(raw, str):
        raise ValueError(
            f"rid {meta.get('id')}: no meta_info.routed_experts in the answer; "
            "start SGLang with --enable-return-routed-experts"
        )
    values = np.frombuffer(base64.b64decode(raw), dtype=np.int32)
    if values.size != rows * shape[0] * shape[1]:
        raise ValueError(
            f"rid {meta.get('id')}: routed_experts holds {values.size} ids, "
            f"expected {rows} x {shape[0]} x {shape[1]}"
        )
    return torch.from_numpy(values.copy()).view(rows, *shape)
