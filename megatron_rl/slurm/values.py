"""What the job script accepts for the string settings of ``SlurmConfig``, and how they are
written into it (``slurm/job.sbatch.j2``).

``#SBATCH`` lines are read by sbatch, not by bash, so shell quoting means nothing there: the
values on them are checked against the formats sbatch documents (``--time``, ``--mem``, the
names of partitions, accounts and QOSes) and a value that may hold blanks (the job name, the
output path) is written with :func:`sbatch_quote`. sbatch splits an ``#SBATCH`` line into words
at blanks, honours ``'...'``, ``"..."`` and backslash escapes, and drops an unquoted ``#`` and the
rest of the line (Slurm 22.05 here: ``tests/integration/test_sbatch_quoting.py`` submits such a
header to a real cluster). The other values are shell words, checked to be one line and
shell-quoted in the template (its ``q`` filter); ``setup`` lines and ``train_command`` are shell
by design and run verbatim, one line each.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from megatron_rl.text_checks import bad_char, check_line

# sbatch --time: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
# days-hours:minutes, days-hours:minutes:seconds; 0, UNLIMITED or INFINITE for no limit
TIME = re.compile(r"\d+(:\d+){0,2}|\d+-\d+(:\d+){0,2}|(?i:unlimited|infinite)")
MEM = re.compile(r"\d+[KMGTkmgt]?")  # sbatch --mem: a number (megabytes) or with a K/M/G/T unit
NAME = r"[A-Za-z0-9_.+@-]+"  # a partition, account or QOS name
NAMES = {"partition": re.compile(rf"{NAME}(,{NAME})*"), "account": re.compile(NAME)}
NAMES["qos"] = NAMES["account"]
# NCCL_SOCKET_IFNAME: interface names (prefixes) in a comma list, '^' to exclude, '=' for exact
IFNAME = r"[A-Za-z0-9_.:@-]+"
INTERFACES = re.compile(rf"\^?=?{IFNAME}(,{IFNAME})*")
SBATCH_SAFE = re.compile(r"[\w@%+=:,./-]+", re.ASCII)  # written on an #SBATCH line as it is
SHELL_LINES = ("setup", "train_command")  # run verbatim by bash: a tab is allowed


def check_strings(s: Any) -> None:
    """Every string setting of ``s`` (a ``SlurmConfig``, unnamed here: config.py imports this
    module): one line, and in the format sbatch documents where it goes
    on an ``#SBATCH`` line; ValueError naming ``slurm.<key>``, the value and what is allowed."""
    for f in dataclasses.fields(s):
        value = getattr(s, f.name)
        allow = "\t" if f.name in SHELL_LINES else ""
        if isinstance(value, str):
            check_line(f"slurm.{f.name}", value, allow)
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, str):
                    check_line(f"slurm.{f.name}[{i}]", item, allow)
    if not TIME.fullmatch(s.time_limit):
        raise ValueError(
            f"slurm.time_limit={s.time_limit!r} is not an sbatch --time: use HH:MM:SS or "
            "D-HH:MM:SS (also MM, MM:SS, D-HH, D-HH:MM; 0 or UNLIMITED for no limit)"
        )
    if s.mem and not MEM.fullmatch(s.mem):
        raise ValueError(
            f"slurm.mem={s.mem!r} is not an sbatch --mem: a whole number of megabytes, or one "
            "with a K, M, G or T unit (e.g. 512G; 0 = all the node's memory)"
        )
    for key, pattern in NAMES.items():
        value = getattr(s, key)
        if value and not pattern.fullmatch(value):
            lists = ", or a comma-separated list of them" if key == "partition" else ""
            raise ValueError(
                f"slurm.{key}={value!r} is not a Slurm {key} name: letters, digits and "
                f"_ . + @ - only{lists} (no blanks, quotes or shell characters)"
            )
    if s.network_interface and not INTERFACES.fullmatch(s.network_interface):
        raise ValueError(
            f"slurm.network_interface={s.network_interface!r} is not an NCCL_SOCKET_IFNAME: "
            "interface names (letters, digits, _ . : @ -), comma-separated, optionally "
            "prefixed by '^' (exclude) and/or '=' (exact match), e.g. ib0, eth0,eth1, ^lo,docker"
        )
    for i, line in enumerate(s.extra_sbatch):
        check_sbatch_option(f"slurm.extra_sbatch[{i}]", line)


def check_sbatch_option(key: str, line: str) -> None:
    """One ``#SBATCH`` line's options, as sbatch reads them: starting with ``-``, quotes closed,
    no trailing backslash (sbatch would read the end of the line into the value)."""
    words = sbatch_words(line, key)
    if not words or not words[0].startswith("-"):
        raise ValueError(
            f"{key}={line!r} is not an sbatch option: each entry is one '#SBATCH' line of "
            "options starting with '-' or '--', e.g. --exclusive or --constraint=h100"
        )


def sbatch_words(line: str, key: str = "line") -> list[str]:
    """The words sbatch reads from the text after ``#SBATCH`` (blanks split, ``'`` and ``"``
    quote, a backslash escapes the next character, an unquoted ``#`` ends the line);
    ValueError naming ``key`` for an unclosed quote or a trailing backslash."""
    words: list[str] = []
    word: list[str] = []
    started, quote, escaped = False, "", False  # started: a word began ('' is one too)
    for ch in line:
        if escaped:
            word.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = started = True
        elif quote:
            if ch == quote:
                quote = ""
            else:
                word.append(ch)
        elif ch in "'\"":
            quote, started = ch, True
        elif ch == "#":
            break
        elif ch in " \t":
            if started:
                words.append("".join(word))
            word, started = [], False
        else:
            word.append(ch)
            started = True
    if quote or escaped:
        what = f"the quote {quote} is not closed" if quote else "it ends in a backslash"
        raise ValueError(f"{key}={line!r}: {what}, so sbatch would misread the line")
    if started:
        words.append("".join(word))
    return words


def sbatch_quote(value: str) -> str:
    """``value`` as one word of an ``#SBATCH`` line: as it is when it holds only safe
    characters, else in double quotes with ``\\`` and ``"`` escaped (how sbatch reads it)."""
    if SBATCH_SAFE.fullmatch(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def output_pattern(run_dir: str) -> str:
    """``#SBATCH --output`` for a job in ``run_dir``: ``%`` doubled (Slurm expands ``%j``,
    ``%x``... in the path); a backslash is refused, since Slurm then stops expanding ``%j``."""
    if "\\" in run_dir or bad_char(run_dir) is not None:
        raise ValueError(
            f"output_dir: the run directory {run_dir!r} holds a backslash or a control "
            "character, which Slurm's --output cannot hold (after a backslash it stops "
            "replacing %j); use a path without one"
        )
    return run_dir.replace("%", "%%") + "/slurm-%j.out"
