"""Checks for user strings that become file names, shell words or lines of a script.

A config value travels far: ``run_name`` becomes a directory under ``output_dir``, Slurm settings
become lines of the job script (``slurm/job.sbatch.j2``). A newline there starts a new command and
``../`` leaves the output folder, so such values are checked once, at config validation, with a
``ValueError`` naming the key, the value and what is allowed. A leaf module: no imports from the
package, so every section's ``validate()`` may use it.
"""

from __future__ import annotations

import unicodedata

# Unicode categories refused in one-line values: control characters (C0 incl. NUL, DEL, C1),
# invisible format characters (e.g. U+202E, which reverses how the rest of a line is shown),
# lone surrogates (cannot be encoded as a file name) and the line/paragraph separators.
REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
NAME_MAX = 255  # bytes in one file name (Linux NAME_MAX)


def bad_char(text: str, allow: str = "") -> str | None:
    """The first character of ``text`` in :data:`REFUSED_CATEGORIES` not in ``allow``, or None."""
    for ch in text:
        if ch not in allow and unicodedata.category(ch) in REFUSED_CATEGORIES:
            return ch
    return None


def check_line(key: str, value: str, allow: str = "") -> None:
    """``value`` is one line of printable text (``allow``: control characters let through, e.g.
    a tab in a shell line); ValueError naming ``key`` otherwise."""
    ch = bad_char(value, allow)
    if ch is not None:
        raise ValueError(
            f"{key}={value!r} holds the control character {ch!r}: it must be one line of "
            "printable text (no newline, carriage return, NUL or other control characters)"
        )


def check_path_component(key: str, value: str, parent: str) -> None:
    """``value`` names one new entry inside the folder ``parent`` (a key name, for the message):
    not empty, not ``.`` or ``..``, no ``/`` or ``\\`` (so no absolute path), no control
    characters, no leading or trailing blank, at most :data:`NAME_MAX` bytes."""
    why = None
    if not value:
        why = "it is empty"
    elif value in (".", ".."):
        why = f"{value!r} is not a new folder"
    elif "/" in value or "\\" in value:
        why = "it holds a path separator ('/' or '\\'), so it would not stay inside " + parent
    elif bad_char(value) is not None:
        why = f"it holds the control character {bad_char(value)!r}"
    elif value != value.strip():
        why = "it starts or ends with a blank"
    elif len(value.encode("utf-8")) > NAME_MAX:
        why = f"it is longer than {NAME_MAX} bytes (the limit of one file name)"
    if why:
        raise ValueError(
            f"{key}={value!r} is refused: {why}. {key} is the name of one folder inside "
            f"{parent}: letters, digits and punctuation such as . _ - (not '.' or '..', no '/' "
            f"or '\\', no control characters, at most {NAME_MAX} bytes)"
        )
