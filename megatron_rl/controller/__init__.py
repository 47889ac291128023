"""The controller: global rank 0's half of every RL step (docs/distributed.md).

It plans (the domain scheduler), generates (``generate.py``; multi-turn episodes run through
``rollout/episodes.py``, which evaluation shares), scores, computes advantages
(``advantages.py``) and packs each DP rank's share (``batches.py``, ``shares.py``); it owns the
engine (``engine.py``), the reward-hacking monitor and the samples table (``monitoring.py``).
``controller.py`` strings these together per step.
Trainer ranks never import it; they receive their shares through ``train/data_plane.py``.
"""
