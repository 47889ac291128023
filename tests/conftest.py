"""Shared pytest set-up: skip ``@pytest.mark.gpu`` tests without CUDA; tiny-model fixtures; one
fleet API key for the whole session.

The key: every rollout server and router the tests start refuses requests without it, so the
session sets ``$MEGATRON_RL_API_KEY`` (a fresh random key, never written to disk) for this
process and every process it starts, and tests that call servers over raw HTTP send
:func:`auth_headers`. Tests of where a key comes from (tests/integration/test_fleet_auth.py)
remove the variable and use the key files.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import pytest
import torch

from megatron_rl.model.config import ModelConfig, ParallelConfig
from megatron_rl.rollout.auth import API_KEY_ENV

os.environ.setdefault(API_KEY_ENV, secrets.token_urlsafe(32))  # before any test starts a process


def auth_headers() -> dict[str, str]:
    """The session key as request headers, for raw HTTP calls to the tests' servers."""
    return {"Authorization": f"Bearer {os.environ[API_KEY_ENV]}"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def tiny_model_config(**overrides: object) -> ModelConfig:
    """A ~0.2M-parameter Llama/Qwen2-shaped model: 2 layers, hidden 64, head size 32, vocab 128."""
    fields: dict[str, object] = dict(
        num_layers=2,
        hidden_size=64,
        ffn_hidden_size=128,
        num_attention_heads=2,
        num_query_groups=1,
        vocab_size=128,
        max_position_embeddings=128,
    )
    fields.update(overrides)
    return ModelConfig(**fields)  # type: ignore[arg-type]


@pytest.fixture
def tiny_cfg() -> ModelConfig:
    return tiny_model_config()


@pytest.fixture(scope="module")
def dist1() -> Iterator[object]:
    """torch.distributed + Megatron state for one process (world 1, gloo on CPU), per module."""
    from megatron_rl.model.parallel import destroy_distributed, init_distributed

    torch.set_num_threads(1)
    info = init_distributed(ParallelConfig(), seed=1234)
    yield info
    destroy_distributed()
