"""One way to stop domain code that runs too long in this process: an interval timer whose
signal raises into the block (the registry's plugin loads, ``domains check``'s CPU limit on a
draw, a prompt-set draw near its deadline in a domain worker).

Signals reach only the main thread, so elsewhere (or without ``setitimer``) the block runs
without a limit.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def interrupt_after(
    seconds: float, error: Callable[[], BaseException], cpu: bool = False
) -> Iterator[None]:
    """Raise ``error()`` inside the block after ``seconds`` of wall time (``cpu``: of process
    CPU time); no limit for ``seconds <= 0`` or off the main thread."""
    main = threading.current_thread() is threading.main_thread()
    if seconds <= 0 or not main or not hasattr(signal, "setitimer"):
        yield
        return
    sig, timer = (
        (signal.SIGVTALRM, signal.ITIMER_VIRTUAL) if cpu else (signal.SIGALRM, signal.ITIMER_REAL)
    )

    def fire(signum: int, frame: Any) -> None:
        raise error()

    previous = signal.signal(sig, fire)
    signal.setitimer(timer, seconds)
    try:
        yield
    finally:
        signal.setitimer(timer, 0)
        signal.signal(sig, previous)
