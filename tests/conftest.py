"""Shared pytest set-up: skip ``@pytest.mark.gpu`` tests without CUDA; tiny-model fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from megatron_rl.model.config import ModelConfig, ParallelConfig


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
