"""Sandboxed execution of model-written code for code rewards.

``run_program`` runs one program (optionally against a tests file) in bubblewrap namespaces and
returns an ExecResult whose ``status`` is decided by the harness, never by the candidate;
``SandboxPool`` runs many in parallel with back-pressure. Design and threat model:
docs/sandbox.md.
"""

from megatron_rl.rewards.sandbox.pool import SandboxPool
from megatron_rl.rewards.sandbox.result import STATUSES, ExecResult, SandboxUnavailable
from megatron_rl.rewards.sandbox.runner import Limits, run_program

__all__ = ["STATUSES", "ExecResult", "Limits", "SandboxPool", "SandboxUnavailable", "run_program"]
