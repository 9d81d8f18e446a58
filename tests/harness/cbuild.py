"""Build a C fake once and share it: every test, test process and pytest-xdist worker reuses one build.

The fakes of the vendor libraries (tests/fakes/fakenvml.py, tests/fakes/fakeamdsmi.py) are compiled
into ``tests/fakes/.build/<name>-<key>/``, where ``<key>`` hashes what the build reads (sources,
flags, options). A directory there is always complete: the build runs in a private directory that
is renamed into place at the end. An exclusive lock (``flock``) per key makes a second process that
asks for the same build wait for the first instead of compiling it again.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

BUILD_ROOT = Path(__file__).resolve().parents[1] / "fakes" / ".build"


def cached(name: str, key: bytes, build: Callable[[Path], object]) -> Path:
    """The directory ``BUILD_ROOT/<name>-<16 hex digits hashing name and key>``, made by ``build(directory)``
    if it is missing.

    ``build`` fills the empty directory it is given (or raises: nothing is kept then).
    """
    digest = hashlib.sha256(name.encode() + b"\0" + key).hexdigest()[:16]
    out = BUILD_ROOT / f"{name}-{digest}"
    if out.is_dir():
        return out
    BUILD_ROOT.mkdir(parents=True, exist_ok=True)
    ignore = BUILD_ROOT / ".gitignore"
    if not ignore.exists():
        ignore.write_text("*\n")
    with open(BUILD_ROOT / f".{name}-{digest}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if out.is_dir():  # another process built it while this one waited
            return out
        work = Path(tempfile.mkdtemp(prefix=f".{name}-{digest}.", dir=BUILD_ROOT))
        try:
            build(work)
            os.replace(work, out)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
    return out
