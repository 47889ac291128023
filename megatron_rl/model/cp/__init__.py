"""Context parallelism of the policy: one long row split over the CP ranks of a group.

- ``shard.py``: the load-balanced causal split, its inverse, the gathers, and
  ``check_cp_supported`` (CP on GPU needs Transformer Engine). Pure; tested on CPU.
- ``attention.py``: our CP attention over gloo in TE's THD load-balanced layout (the CPU path).
- ``te.py``: the GPU path: a rank's THD inputs and ``PackedSeqParams`` for TE under CP.
- ``switch.py``: length-switched CP: rows shorter than ``parallel.cp_min_tokens`` run whole on
  one CP rank, so below it the CP group works as data parallelism.
"""
