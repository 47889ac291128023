"""Sandboxed execution of model-written code for code rewards.

``run_program`` runs one program (optionally against a tests file) in bubblewrap namespaces and
returns an ExecResult whose ``status`` is decided by the harness, never by the candidate;
``SandboxPool`` runs many in parallel with back-pressure. Design and threat model:
docs/sandbox.md. It imports nothing else of the library: the domain API runs code in it
(``megatron_rl/domains/code_exec.py``, the code verifiers of the task sets and plugins).
"""

from megatron_rl.sandbox.pool import SandboxPool
from megatron_rl.sandbox.result import STATUSES, ExecResult, SandboxUnavailable
from megatron_rl.sandbox.runner import Limits, run_program

__all__ = ["STATUSES", "ExecResult", "Limits", "SandboxPool", "SandboxUnavailable", "run_program"]
