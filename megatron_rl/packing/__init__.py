"""Packed sequences, used by every training step: the packed batch and DP balancing.

- ``batch.py``: :class:`PackedBatch` (THD layout with ``cu_seqlens``), packing one sequence per
  sample or each GRPO group's prompt once (shared prefixes), and the log-prob alignment
  convention every part of megatron-rl follows.
- ``balance.py``: token-budget micro-batches balanced over data-parallel ranks (Karmarkar-Karp /
  longest-first).
"""
