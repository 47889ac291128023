"""Judge side, run in its own sandbox: run the tests, calling the candidate over a pipe.

Usage: ``python -I -B judge.py TESTS MEMORY_MB CPU_S REQ_FD RESP_FD VERDICT_FD``. The tests' code
runs here and only here; the candidate's code never does. Each name the program defines becomes
a proxy whose call sends plain-data arguments to the candidate process and returns the plain-data
reply (wire.py), so ``assert f(x) == y`` compares builtin values the candidate cannot give custom
behaviour. One JSON line per test goes to VERDICT_FD, a pipe only this process and the host hold,
then a final ``done`` line: a verdict without ``done`` is treated by the host as no verdict.
"""

from __future__ import annotations

import builtins
import json
import os
import resource
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import confine
import wire


class CandidateGone(BaseException):
    """The candidate process closed its channel (exited, crashed or was killed)."""


class RemoteError(Exception):
    """An exception raised in the candidate whose type is not a builtin exception."""


class Channel:
    def __init__(self, req_fd: int, resp_fd: int) -> None:
        self.req_fd, self.resp_fd, self.gone = req_fd, resp_fd, False

    def recv(self) -> dict:
        try:
            return wire.recv(self.resp_fd)
        except EOFError:
            self.gone = True
            raise CandidateGone("the candidate process exited") from None
        except wire.WireError as e:
            self.gone = True  # the stream is out of step: no later reply can be trusted
            raise CandidateGone(f"the candidate broke the protocol: {e}") from None

    def call(self, name: str, args: tuple, kwargs: dict) -> object:
        if self.gone:
            raise CandidateGone("the candidate process exited")
        try:
            wire.send(
                self.req_fd,
                {"name": name, "args": wire.encode(args), "kwargs": wire.encode(kwargs)},
            )
        except BrokenPipeError:
            self.gone = True
            raise CandidateGone("the candidate process exited") from None
        reply = self.recv()
        if "ok" in reply:
            return wire.decode(reply["ok"])
        exc_type = getattr(builtins, str(reply.get("exc")), None)
        if not (isinstance(exc_type, type) and issubclass(exc_type, Exception)):
            exc_type = RemoteError
        raise exc_type(f"{reply.get('exc')}: {reply.get('msg')}")


def proxy(channel: Channel, name: str):
    def call(*args: object, **kwargs: object) -> object:
        return channel.call(name, args, kwargs)

    call.__name__ = call.__qualname__ = name
    return call


def candidate_namespace(channel: Channel) -> tuple[dict, str | None]:
    """The program's names as proxies and values, or ({}, why) when it did not load."""
    try:
        hello = channel.recv()
    except CandidateGone as e:
        return {}, f"no definitions received ({e})"
    if "load_error" in hello:
        return {}, str(hello["load_error"])
    names, values = hello.get("names", {}), hello.get("values", {})
    namespace: dict[str, object] = {}
    for name, kind in names.items():
        if not (isinstance(name, str) and name.isidentifier()):
            continue
        if kind == "callable":
            namespace[name] = proxy(channel, name)
        elif kind == "value" and name in values:
            namespace[name] = wire.decode(values[name])
    return namespace, None


def report(fd: int, record: dict) -> None:
    data = (json.dumps(record) + "\n").encode()
    while data:
        data = data[os.write(fd, data) :]


def run_tests(tests_path: str, channel: Channel, verdict_fd: int) -> None:
    solution, load_error = candidate_namespace(channel)
    module = types.ModuleType("solution")
    module.__dict__.update(solution)
    sys.modules["solution"] = module
    namespace: dict[str, object] = {"__name__": "tests", **solution}
    with open(tests_path, encoding="utf-8") as f:
        exec(compile(f.read(), "tests.py", "exec"), namespace)
    tests = [
        (name, fn)
        for name, fn in namespace.items()
        if name.startswith("test")
        and isinstance(fn, types.FunctionType)
        and fn.__code__.co_filename == "tests.py"
    ]
    for name, fn in tests:
        record: dict[str, object] = {"test": name, "ok": False}
        if load_error is not None:
            record["error"] = f"program did not load: {load_error}"
        elif channel.gone:
            record["error"] = "the candidate process exited"
        else:
            try:
                fn()
                # a test that swallowed CandidateGone (bare except) still does not pass
                record["ok"] = not channel.gone
            except CandidateGone as e:
                record["error"] = str(e)
            except Exception as e:
                record["error"] = f"{type(e).__name__}: {str(e)[:500]}"
        report(verdict_fd, record)
    report(verdict_fd, {"done": True, "total": len(tests), "load_error": load_error})


def main(argv: list[str]) -> None:
    tests_path, memory_mb, cpu_s, req_fd, resp_fd, verdict_fd = argv[:6]
    confine.close_fds_except({int(req_fd), int(resp_fd), int(verdict_fd)})
    confine.leave_session_keyring()
    confine.enter_landlock()
    resource.setrlimit(resource.RLIMIT_AS, (int(memory_mb) << 20,) * 2)
    resource.setrlimit(resource.RLIMIT_CPU, (int(cpu_s),) * 2)
    run_tests(tests_path, Channel(int(req_fd), int(resp_fd)), int(verdict_fd))


if __name__ == "__main__":
    main(sys.argv[1:])
