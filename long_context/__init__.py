"""Long sequences: packing, data-parallel balancing, context parallelism, long-context tasks.

- ``packing.py``: :class:`PackedBatch` (THD layout with ``cu_seqlens``) and the log-prob alignment
  convention every part of megatron-rl follows.
- ``balance.py``: token-budget micro-batches balanced over data-parallel ranks (Karmarkar-Karp /
  longest-first), separate budgets for the log-prob and training passes.
- ``cp.py``: the load-balanced causal split for context parallelism, its inverse, and
  ``check_cp_supported`` (CP needs Transformer Engine). Pure; tested on CPU.
- ``cp_te.py``: the GPU path: a rank's THD inputs and ``PackedSeqParams`` for TE under CP.
- ``tasks.py``: long-context task generators (needle, key-value chains, document synthesis) at
  1k-128k tokens with a length curriculum; ``domains/long_context.py`` exposes them as domains.
"""
