"""Byte-level tokenizer of the tiny default model, and the one place prompts are templated.

The tiny model reads raw bytes: ids 0-255 are the 256 byte values (through the GPT-2 byte-to-
unicode alphabet, so the tokenizer is a plain HF ``tokenizers`` BPE with no merges), followed by a
few special tokens. It is saved in HF format (``tokenizer.json`` + ``tokenizer_config.json`` with a
chat template), so every engine that loads HF tokenizers (transformers, vLLM, SGLang) can use it.
Real runs use the tokenizer and chat template of their own HF checkpoint; all prompt rendering
goes through :func:`render_chat` so both cases share one code path.

Chat format of the tiny tokenizer (chosen to be short: every template byte costs a tiny model
compute): ``<|user|>{prompt}<|assistant|>{response}<|end|>``; tool observations in multi-turn
episodes are ``<|tool|>{observation}`` turns.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<|end|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|system|>", "<|pad|>"]
EOS = "<|end|>"
PAD = "<|pad|>"
NUM_BYTES = 256

# Jinja chat template stored in tokenizer_config.json (HF apply_chat_template reads it).
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}<|user|>{{ m['content'] }}"
    "{% elif m['role'] == 'assistant' %}<|assistant|>{{ m['content'] }}<|end|>"
    "{% elif m['role'] == 'tool' %}<|tool|>{{ m['content'] }}"
    "{% elif m['role'] == 'system' %}<|system|>{{ m['content'] }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def _byte_alphabet() -> list[str]:
    """The 256 printable stand-ins for bytes used by byte-level BPE (GPT-2's mapping)."""
    return sorted(pre_tokenizers.ByteLevel.alphabet(), key=_byte_value)


def _byte_value(ch: str) -> int:
    # Inverse of the GPT-2 byte->unicode table: printable latin-1 bytes map to themselves,
    # the rest were shifted to code points 256+ in byte order.
    printable = list(range(ord("!"), ord("~") + 1))
    printable += list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    if ord(ch) in printable:
        return ord(ch)
    others = [b for b in range(256) if b not in printable]
    return others[ord(ch) - 256]


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The byte-level tokenizer: 256 byte ids then the special tokens (262 ids in all)."""
    vocab = {ch: i for i, ch in enumerate(_byte_alphabet())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=1 << 20,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def save_tokenizer(out_dir: str | Path) -> None:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json to ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer().save_pretrained(str(out))
    # Keep the template readable for people who open the file.
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg_path.write_text(json.dumps(cfg, indent=2))


def load_tokenizer(path: str | Path | None) -> PreTrainedTokenizerBase:
    """The HF tokenizer of a checkpoint directory, or the byte-level one when ``path`` is None."""
    if path is None:
        return build_tokenizer()
    p = Path(path)
    if not (p / "tokenizer.json").is_file() and not (p / "tokenizer_config.json").is_file():
        raise ValueError(f"no tokenizer files (tokenizer.json / tokenizer_config.json) in {p}")
    return AutoTokenizer.from_pretrained(str(p))


def render_chat(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = True,
) -> str:
    """Render chat messages with the tokenizer's own template (the single templating path)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("tokenizer has no chat_template; set one in tokenizer_config.json")
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    return str(text)


def prompt_ids(tokenizer: PreTrainedTokenizerBase, prompt: str) -> list[int]:
    """Token ids of a single-turn user prompt followed by the assistant generation prompt."""
    text = render_chat(tokenizer, [{"role": "user", "content": prompt}])
    return list(tokenizer.encode(text, add_special_tokens=False))


def eos_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """Id of the token that ends an assistant turn (generation stops there)."""
    eid = tokenizer.eos_token_id
    if eid is None:
        raise ValueError("tokenizer has no eos_token")
    return int(eid)
