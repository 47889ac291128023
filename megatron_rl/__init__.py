"""megatron-rl: RL post-training with verifiable rewards on Megatron-core."""

__version__ = "0.1.0"
