"""Slurm launch settings: the ``slurm:`` section of the run config (``config``: ``SlurmConfig``,
the layout of a job on an allocation) and what the job script accepts for its string settings
and how they are written into it (``values``). ``megatron-rl submit`` (``launch/``) reads them;
the library's ``RunConfig`` nests ``SlurmConfig``, so they live here, not in ``launch/``."""
