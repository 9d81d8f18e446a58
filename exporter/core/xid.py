"""How serious a GPU error event is: ``fatal``, ``warn`` or ``ignore``, from NVIDIA's XID catalogue
and an operator's overrides. The exporter (the per-GPU health state) and the profiler (``GPUHealthy``)
both ask :func:`severity`, so one table decides for both daemons.

The defaults are NVIDIA's published XID catalogue (``xid_catalogue.tsv`` beside this module cites
it): each code's "Resolution Bucket (Immediate Action)" becomes a severity by :data:`BUCKET_SEVERITY`:

- ``fatal``: the GPU needs a reset, a reboot or a person before it takes work again
  (RESET_GPU, RESTART_BM, RESTART_VM, WORKFLOW_XID_48, the NVLink workflows, CHECK_MECHANICALS,
  UPDATE_SWFW);
- ``warn``: the application died or should be looked at, the GPU itself is usable (RESTART_APP,
  CHECK_UVM, WORKFLOW_XID_45, XID_154_EVAL, and CONTACT_SUPPORT, which the catalogue gives the codes
  no current driver raises);
- ``ignore``: informational (IGNORE).

A code the catalogue does not list is ``warn``: seen, never silently dropped, never draining a node
on a guess.

AMD has no XIDs; its RAS and ECC events have names (:data:`EVENTS`, from ``ras_events.tsv``, which
cites AMD's and NVIDIA's sources), mapped to the same three severities the way NVIDIA's catalogue
treats the equivalent XID (an uncorrectable ECC error is XID 48, fatal; deferred (poisoned) data is
XID 94, warn; a retired page is XID 63, ignore; a retirement that failed is XID 64, fatal), and one
per RAS state amdsmi reports for a block (``ras_mult_uc`` fatal, ``ras_poison`` and ``ras_parity``
warn, ``ras_sing_c`` ignore). NVIDIA's ECC counters use the same names.

Overrides are a mapping from an XID code (an int, or its decimal string as YAML keys often are)
or an event name to a severity. :func:`load_overrides` checks one and raises :class:`XidConfigError`,
whose ``str()`` is a one-line message naming the bad key or value.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Literal

Severity = Literal["fatal", "warn", "ignore"]
SEVERITIES: tuple[Severity, ...] = ("fatal", "warn", "ignore")
#: a code that is not in the catalogue
UNKNOWN_SEVERITY: Severity = "warn"

#: NVIDIA's immediate-action bucket -> our severity (the module docstring says why)
BUCKET_SEVERITY: dict[str, Severity] = {
    "RESET_GPU": "fatal",
    "RESTART_BM": "fatal",
    "RESTART_VM": "fatal",
    "WORKFLOW_XID_48": "fatal",
    "WORKFLOW_NVLINK_ERR": "fatal",
    "WORKFLOW_NVLINK5_ERR": "fatal",
    "CHECK_MECHANICALS": "fatal",
    "UPDATE_SWFW": "fatal",
    "RESTART_APP": "warn",
    "CHECK_UVM": "warn",
    "WORKFLOW_XID_45": "warn",
    "XID_154_EVAL": "warn",
    "CONTACT_SUPPORT": "warn",
    "IGNORE": "ignore",
}



def _rows(name: str) -> Iterator[tuple[int, list[str]]]:
    """(line number, tab-separated fields) of each row of the packaged data file ``name`` ('#': comments)."""
    text = resources.files("exporter.core").joinpath(name).read_text(encoding="utf-8")
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip() and not line.startswith("#"):
            yield n, line.split("\t")


@cache
def _events() -> dict[str, Severity]:
    """The packaged RAS/ECC events (``ras_events.tsv``, which cites its sources), read once."""
    out: dict[str, Severity] = {}
    for n, (name, sev, _what) in _rows("ras_events.tsv"):
        if name in out or sev not in SEVERITIES:  # a packaging defect, caught by the tests
            raise ValueError(f"ras_events.tsv line {n}: duplicate event or unknown severity {sev!r}")
        out[name] = sev  # a Severity: checked against SEVERITIES above
    return out


#: vendor-neutral RAS/ECC events (AMD's amdsmi ECC counts and per-block RAS states; NVIDIA's ECC counters
#: and retired pages) -> default severity, each as the catalogue rates the equivalent XID (ras_events.tsv)
EVENTS: Mapping[str, Severity] = _events()

MAX_XID = 1 << 16  # XID codes are small; a larger key is a typo
_NAMED = "a RAS/ECC event (ecc_*, page_*, ras_*: docs/metrics.md lists them)"  # the list is too long for one line


class XidConfigError(ValueError):
    """A bad override; ``str()`` is one line naming the culprit."""


@dataclass(frozen=True)
class Entry:
    """One catalogue row."""

    code: int
    bucket: str  # NVIDIA's "Resolution Bucket (Immediate Action)"
    mnemonic: str
    severity: Severity


@cache
def catalogue() -> Mapping[int, Entry]:
    """The packaged catalogue, by code (read once)."""
    out: dict[int, Entry] = {}
    for n, (code_s, bucket, mnemonic) in _rows("xid_catalogue.tsv"):
        code = int(code_s)
        if code in out or bucket not in BUCKET_SEVERITY:  # a packaging defect, caught by the tests
            raise ValueError(f"xid_catalogue.tsv line {n}: duplicate code or unknown bucket {bucket!r}")
        out[code] = Entry(code, bucket, mnemonic, BUCKET_SEVERITY[bucket])
    return out


def _key(raw: object, where: str) -> int | str:
    """An override's key as an XID code (int) or an event name, or :class:`XidConfigError`."""
    if isinstance(raw, bool):
        raise XidConfigError(f"{where}: key {raw!r} is not an XID code or {_NAMED}")
    if isinstance(raw, int):
        code = raw
    elif isinstance(raw, str) and raw.strip().isdigit() and raw.strip().isascii():
        code = int(raw.strip())
    elif isinstance(raw, str) and raw in EVENTS:
        return raw
    else:
        shown = repr(raw) if len(repr(raw)) <= 60 else repr(raw)[:57] + "..."
        raise XidConfigError(f"{where}: key {shown} is not an XID code or {_NAMED}")
    if not 0 < code < MAX_XID:
        raise XidConfigError(f"{where}: XID code {code} is out of range (1-{MAX_XID - 1})")
    return code


def load_overrides(raw: object, where: str = "xid_severity") -> dict[int | str, Severity]:
    """Check an overrides mapping (``{48: fatal, "13": ignore, ecc_corrected: warn}``) and return it with
    int codes. None or an empty mapping: no overrides. ``where`` names the setting in the error."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise XidConfigError(f"{where}: expected a mapping of XID code or event to severity, "
                             f"got {type(raw).__name__}")
    out: dict[int | str, Severity] = {}
    for k, v in raw.items():
        key = _key(k, where)
        if not isinstance(v, str) or v.strip().lower() not in SEVERITIES:
            shown = repr(v) if len(repr(v)) <= 60 else repr(v)[:57] + "..."
            raise XidConfigError(f"{where}: {key}: severity {shown} is not one of {', '.join(SEVERITIES)}")
        if key in out:
            raise XidConfigError(f"{where}: {key} is given twice")
        out[key] = v.strip().lower()  # type: ignore[assignment]  # checked against SEVERITIES above
    return out


def severity(code: int | str, overrides: Mapping[int | str, Severity] | None = None) -> Severity:
    """The severity of XID ``code`` (an int) or RAS/ECC event ``code`` (a name in :data:`EVENTS`):
    the operator's override, else the catalogue's, else ``warn``. ``overrides`` as
    :func:`load_overrides` returns it."""
    if overrides:
        given = overrides.get(code)
        if given is not None:
            return given
    if isinstance(code, str):
        return EVENTS.get(code, UNKNOWN_SEVERITY)
    entry = catalogue().get(code)
    return entry.severity if entry is not None else UNKNOWN_SEVERITY
