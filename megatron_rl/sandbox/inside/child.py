"""Candidate side, run inside the sandbox: set limits, load the program, answer calls.

Usage: ``python -I -B child.py PROGRAM MEMORY_MB CPU_S NPROC NOFILE FSIZE_BYTES [REQ_FD RESP_FD]``.
Without the two fds the program runs as ``__main__`` (script mode). With them it is loaded as
module ``solution`` and this loop answers the judge's calls. Everything here can be overwritten
by the candidate once its code runs; that is fine, because nothing here decides the verdict:
the judge only ever receives plain data (see wire.py), and the limits are set before the
candidate's first instruction and cannot be raised again by an unprivileged process, and the
process is confined first (confine.py: no stray fds, an empty session keyring, its own Landlock
domain).
"""

from __future__ import annotations

import os
import resource
import sys
import traceback
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import confine
import wire

COMPILE_ERROR_EXIT = 3  # exit status when the program does not compile


def set_limits(memory_mb: int, cpu_s: int, nproc: int, nofile: int, fsize: int) -> None:
    """Lower soft and hard limits; an unprivileged process cannot raise them again."""
    limits = {
        resource.RLIMIT_AS: memory_mb << 20,
        resource.RLIMIT_CPU: cpu_s,
        resource.RLIMIT_NPROC: nproc,
        resource.RLIMIT_NOFILE: nofile,
        resource.RLIMIT_FSIZE: fsize,
        resource.RLIMIT_CORE: 0,
    }
    for which, value in limits.items():
        resource.setrlimit(which, (value, value))


def compile_program(path: str) -> types.CodeType:
    with open(path, encoding="utf-8", errors="replace") as f:
        source = f.read()
    try:
        return compile(source, "solution.py", "exec")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        sys.stderr.flush()
        os._exit(COMPILE_ERROR_EXIT)


def run_script(code: types.CodeType) -> None:
    namespace = {"__name__": "__main__", "__file__": "solution.py", "__builtins__": __builtins__}
    exec(code, namespace)


def describe(module: types.ModuleType) -> dict:
    """Top-level names the judge may use: callables become proxies, plain data is copied."""
    names: dict[str, str] = {}
    values: dict[str, object] = {}
    for name, value in list(vars(module).items()):
        if name.startswith("__") or isinstance(value, types.ModuleType):
            continue
        if callable(value):
            names[name] = "callable"
            continue
        try:
            values[name] = wire.encode(value)
            names[name] = "value"
        except (wire.WireError, RecursionError):
            pass
    return {"names": names, "values": values}


def answer(module: types.ModuleType, request: dict) -> dict:
    """Run one call from the judge; the reply is plain data or an exception's type and text."""
    try:
        fn = getattr(module, str(request["name"]))
        args = wire.decode(request["args"])
        kwargs = wire.decode(request["kwargs"])
        return {"ok": wire.encode(fn(*args, **kwargs))}
    except BaseException as e:  # noqa: B036 - SystemExit from a call is the call's failure
        return {"exc": type(e).__name__, "msg": str(e)[:2000]}


def serve(code: types.CodeType, req_fd: int, resp_fd: int) -> None:
    module = types.ModuleType("solution")
    module.__dict__["__file__"] = "solution.py"
    sys.modules["solution"] = module
    try:
        exec(code, module.__dict__)
    except BaseException as e:  # noqa: B036 - any escape while loading is a load error
        traceback.print_exc()
        wire.send(resp_fd, {"load_error": f"{type(e).__name__}: {str(e)[:2000]}"})
        return
    wire.send(resp_fd, describe(module))
    while True:
        try:
            request = wire.recv(req_fd)
        except EOFError:
            return
        wire.send(resp_fd, answer(module, request))


def main(argv: list[str]) -> None:
    program, memory_mb, cpu_s, nproc, nofile, fsize = argv[:6]
    confine.close_fds_except({int(fd) for fd in argv[6:8]})
    confine.leave_session_keyring()
    confine.enter_landlock()
    set_limits(int(memory_mb), int(cpu_s), int(nproc), int(nofile), int(fsize))
    code = compile_program(program)
    if len(argv) == 8:
        serve(code, int(argv[6]), int(argv[7]))
    else:
        run_script(code)


if __name__ == "__main__":
    main(sys.argv[1:])
