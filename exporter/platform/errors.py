"""The one error every command reports as one line, and the one escaper for text from outside.

:class:`ConfigError` is bad input (a flag, an env variable, a config or web config file, a
snapshot file): ``str()`` is the one line printed as ``<prog>: error: <line>`` before exiting
with ``code``, 2 unless the raiser says otherwise (the tools also report a failed run as 1, a
command that is not found as 127, as a shell does). Every daemon and tool raises it and
:func:`fail` prints it: one type, one message shape, one exit status for bad input.

:func:`one_line` and :func:`printable` are the one escaper: control and line-breaking characters
from the input (a newline in a path, an escape sequence in a Prometheus error) are shown escaped
(``\\n``, ``\\x1b``, ``\\u2028``), so no message or log line can be split or forged by what it quotes.
"""

from __future__ import annotations

import sys

BAD_INPUT = 2  # exit status of bad input (argparse's, and every command's here)


def _escape(c: str) -> str:
    return c if c.isprintable() else c.encode("unicode_escape").decode("ascii")


def one_line(text: str) -> str:
    """``text`` with its control and line-breaking characters shown escaped; nothing else changes."""
    return "".join(map(_escape, text))


def printable(text: str, limit: int = 200) -> str:
    """Foreign ``text`` (a server's reply, a tenant's label) for one log line: escaped as
    :func:`one_line`, whitespace runs folded to one space, cut to ``limit`` characters (``...`` marks a cut)."""
    out = []
    n = 0
    for c in " ".join(text[: 4 * limit].split()):
        e = _escape(c)
        out.append(e)
        n += len(e)
        if n > limit:
            break
    flat = "".join(out)
    return flat if n <= limit and len(text) <= 4 * limit else flat[:limit] + "..."


class ConfigError(Exception):
    """Bad input, reported as one line (``str()``, escaped by :func:`one_line`); ``code`` is the exit status
    (2, bad input, unless the raiser says otherwise)."""

    def __init__(self, message: str, code: int = BAD_INPUT) -> None:
        super().__init__(one_line(message))
        self.code = code


def fail(prog: str, exc: ConfigError) -> int:
    """Print ``exc`` as ``<prog>: error: <line>`` on stderr; its exit status."""
    sys.stderr.write(f"{prog}: error: {exc}\n")
    return exc.code


def shown_value(value: object) -> str:
    """``repr(value)`` for an error message, cut to a readable length (a YAML file can hold anything)."""
    if isinstance(value, int) and value.bit_length() > 256:  # repr() of 5,000 digits raises
        return f"<an integer of {value.bit_length()} bits>"
    try:
        shown = repr(value)
    except (ValueError, RecursionError):
        shown = f"<a {type(value).__name__}>"
    return shown if len(shown) <= 120 else shown[:100] + "..."
