"""Long-context tasks and data, built on the library (imports run one way: this package imports
``megatron_rl``, never the reverse; ``tests/unit/test_import_graph.py``).

- ``tasks.py``: long-context task generators (needle, key-value chains, document synthesis) at
  1k-128k tokens with a length curriculum; ``domains/long_context.py`` exposes them as domains.
- ``retrieval.py``: the retrieval family the long-context RL run learns on.
- ``sft_data.py``: SFT data for the long-context warm start (training split only).
- ``long_model.py``: long-position variants of a checkpoint (RoPE base and positions raised).

Context parallelism itself runs inside the policy every step, so it lives in the library
(``megatron_rl/model/cp/``), as packing does (``megatron_rl/packing/``).
"""
