"""Evaluation on distinct prompts, in one place.

- ``config.py``: the ``eval`` section of the run config (:class:`EvalConfig`).
- ``prompt_sets.py``: the fixed prompts an eval scores (distinct tasks of one split, each once).
- ``evaluate.py``: engine answers scored by each domain's verifier; greedy or sampled pass@1.
- ``sweeps.py``: the RL loop's evals (held-out sweeps, the training-prompt sample, the summary).
- ``levels.py``: accuracy per difficulty level (context length for long-context domains).
"""
