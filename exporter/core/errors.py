"""The two ways a whole collection fails, shared by the backends that raise them and the engine
that counts them (``gpu_exporter_collection_errors_total{kind}``)."""

from __future__ import annotations

# the kind of a collection failure when the library or the driver itself is gone
DRIVER = "driver"
# ... when a call about no GPU (init, the device count, a CLI run) did not return within its deadline
STALLED = "stalled"


class BackendUnavailable(Exception):
    """This backend cannot run on this machine; the message says why."""


class BackendError(Exception):
    """A collection failed as a whole. ``kind`` labels the error counter."""

    def __init__(self, message: str, kind: str = DRIVER) -> None:
        super().__init__(message)
        self.kind = kind
