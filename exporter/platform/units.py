"""The one size parser and the one duration parser, for every flag, env variable and config key.

Sizes follow the Kubernetes quantity rules (``resource.Quantity``), as a ``limits.memory`` does:
``16M`` is 16,000,000 bytes (decimal: ``k``, ``M``, ``G``, ``T``, ``P``, ``E``) and ``16Mi`` is
16,777,216 (binary: ``Ki``, ``Mi``, ``Gi``, ``Ti``, ``Pi``, ``Ei``). ``KiB``, ``MiB``, ``GiB`` ...
are accepted as the IEC spellings of the binary suffixes, ``kB``/``KB``, ``MB``, ``GB`` ... as the
decimal ones, ``K`` as ``k``, and ``B`` or no suffix means bytes. A fraction is allowed
(``1.5Gi``) and rounded up to whole bytes. Suffixes are case-sensitive, as in Kubernetes (``m``
would be milli there, so it is refused here).

Durations are Go/Prometheus durations: ``90s``, ``30m``, ``1h``, ``1h30m``, ``250ms`` (units
``ns``, ``us``, ``ms``, ``s``, ``m``, ``h``, ``d``), or a bare number of seconds (``90``, ``0.5``).
"""

from __future__ import annotations

import math
import re

_DECIMAL = {"k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
SIZE_UNITS: dict[str, int] = {"": 1, "B": 1, **_DECIMAL, **{f"{k}B": v for k, v in _DECIMAL.items()}, **_BINARY,
                              **{f"{k}B": v for k, v in _BINARY.items()}}
_SIZE = re.compile(r"\s*([0-9]{1,19}(?:\.[0-9]{1,9})?|\.[0-9]{1,9})\s*([A-Za-z]{0,3})\s*")
SIZE_EXAMPLES = "e.g. 16Mi or 16MiB (16 x 2^20 bytes), 16M (16 x 10^6), 8Gi, 512Ki or 1048576"


def parse_size(text: str) -> int:
    """Bytes in ``text`` (Kubernetes quantity rules, above); ValueError naming the examples otherwise."""
    m = _SIZE.fullmatch(text) if isinstance(text, str) else None
    if m is None or m.group(2) not in SIZE_UNITS:
        shown = text if len(str(text)) <= 40 else str(text)[:37] + "..."
        raise ValueError(f"{shown!r} is not a size; expected {SIZE_EXAMPLES}")
    return math.ceil(float(m.group(1)) * SIZE_UNITS[m.group(2)])


_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_NUMBER = r"[0-9]{1,12}(?:\.[0-9]{1,9})?"
_GO = re.compile(rf"(?:{_NUMBER}(?:ns|us|µs|ms|s|m|h|d))+")
_GO_PART = re.compile(rf"({_NUMBER})(ns|us|µs|ms|s|m|h|d)")
_BARE = re.compile(rf"{_NUMBER}|\.[0-9]{{1,9}}")
DURATION_EXAMPLES = "e.g. 90s, 30m, 1h, 1h30m, 250ms or a number of seconds"


def format_duration(seconds: float) -> str:
    """``1800`` -> ``30m``, ``5400`` -> ``90m``, ``3600`` -> ``1h``, ``0.5`` -> ``0.5s``: the largest whole unit."""
    for unit, f in (("h", 3600), ("m", 60)):
        if seconds >= f and seconds % f == 0:
            return f"{int(seconds // f)}{unit}"
    return f"{seconds:g}s"


def parse_duration(text: str, bare_seconds: bool = True) -> float:
    """Seconds in ``text`` (a Go duration, or with ``bare_seconds`` a plain number of seconds);
    ValueError naming the examples otherwise."""
    s = text.strip() if isinstance(text, str) else ""
    if bare_seconds and _BARE.fullmatch(s):
        return float(s)
    if s and _GO.fullmatch(s):
        return sum(float(n) * _UNIT_S[u] for n, u in _GO_PART.findall(s))
    shown = text if len(str(text)) <= 40 else str(text)[:37] + "..."
    raise ValueError(f"{shown!r} is not a duration; expected {DURATION_EXAMPLES}")
