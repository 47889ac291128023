"""The byte-level tokenizer and the one templating path."""

from __future__ import annotations

from transformers import AutoTokenizer

from megatron_rl.model.tokenizer import (
    EOS,
    build_tokenizer,
    eos_id,
    prompt_ids,
    render_chat,
    save_tokenizer,
)


def test_bytes_map_to_their_values() -> None:
    tok = build_tokenizer()
    ids = tok.encode("Az é\n", add_special_tokens=False)
    assert ids == list("Az é\n".encode())
    assert tok.decode(ids) == "Az é\n"
    assert len(tok) == 262 and eos_id(tok) == 256


def test_prompt_template_and_eos() -> None:
    tok = build_tokenizer()
    ids = prompt_ids(tok, "2+2?")
    assert tok.decode(ids) == "<|user|>2+2?<|assistant|>"
    text = render_chat(
        tok, [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], False
    )
    assert text == f"<|user|>q<|assistant|>a{EOS}"


def test_saved_tokenizer_loads_with_transformers(tmp_path) -> None:
    save_tokenizer(tmp_path)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    assert tok.encode("hi<|end|>", add_special_tokens=False) == [104, 105, 256]
    assert tok.eos_token == EOS
    assert prompt_ids(tok, "x") == prompt_ids(build_tokenizer(), "x")
