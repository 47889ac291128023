"""The ``megatron-rl`` command line.

Each subcommand is one module in ``launch/commands/`` exposing ``HELP`` (one line),
``add_arguments(parser)`` and ``main(args) -> int``. Modules are found by name, so adding a
subcommand is adding a file. User errors (``ValueError``) print one line and exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import pkgutil
import sys
import warnings

import launch.commands as commands_pkg


def _command_modules() -> dict[str, str]:
    names = {}
    for info in pkgutil.iter_modules(commands_pkg.__path__):
        if not info.name.startswith("_"):
            names[info.name.replace("_", "-")] = f"launch.commands.{info.name}"
    return dict(sorted(names.items()))


def _say_line(text: str) -> None:
    """``text`` and its newline on stderr in one write: the ranks of a torchrun job share its
    stderr, and ``print`` writes the text and the newline apart, so two ranks' errors could
    otherwise land on one line."""
    line = text + "\n"
    sys.stderr.flush()
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # captured (pytest's capsys): no descriptor
        sys.stderr.write(line)
        sys.stderr.flush()
        return
    view = memoryview(line.encode())
    while view:  # one write up to PIPE_BUF (atomic); a longer message may take more
        view = view[os.write(fd, view) :]


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser; with ``only`` set, just that subcommand's module is imported (fast start)."""
    parser = argparse.ArgumentParser(
        prog="megatron-rl",
        description="RL post-training with verifiable rewards on Megatron-core.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in _command_modules().items():
        if only is not None and name != only:
            continue
        module = importlib.import_module(module_name)
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_main=module.main)
    return parser


def _command_in(argv: list[str]) -> str | None:
    """The subcommand named in ``argv`` (first non-option word), if it is a known one."""
    words = [a for a in argv if not a.startswith("-")]
    return words[0] if words and words[0] in _command_modules() else None


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``parse_args``, except that dotted overrides may also follow a flag: argparse fills a
    ``nargs="*"`` positional from the words before the first flag only, so in
    ``train CONFIG --overwrite a.b=1`` the words after ``--overwrite`` are left over; they are
    appended to ``overrides`` (in order) where the command takes them."""
    args, extra = parser.parse_known_args(argv)
    if extra and isinstance(getattr(args, "overrides", None), list):
        if not any(e.startswith("-") for e in extra):
            args.overrides += extra
            extra = []
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(_command_in(argv))
    args = _parse(parser, argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    if not args.verbose:  # megatron-core and friends are chatty at INFO
        # "Apex / Transformer Engine not installed, falling back to torch": expected on CPU
        warnings.filterwarnings("ignore", message=".*(Apex|Transformer Engine|TE ).*")
        for name in ("megatron", "transformers", "vllm", "httpx", "urllib3"):
            logging.getLogger(name).setLevel(logging.WARNING)
    if not getattr(args, "_main", None):
        parser.print_help()
        return 2
    try:
        return int(args._main(args) or 0)
    except ValueError as e:
        _say_line(f"megatron-rl {args.command}: error: {e}")
        return 2
    except KeyboardInterrupt:
        _say_line(f"megatron-rl {args.command}: interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
