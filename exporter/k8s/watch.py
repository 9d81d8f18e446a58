"""List, then watch, one kind of Kubernetes object in the background (the exporter's node-local views).

A daemon thread lists the objects matching a field selector (``spec.nodeName=<node>``), then
follows a watch from the list's ``resourceVersion``; when the watch ends (its ``timeoutSeconds``)
it resumes from the last version seen, and when the server answers 410 Expired it lists again.
After every change it hands the whole set, ``{uid: object}``, to ``on_change``: consumers
build their own immutable index there, so the scrape path reads a dict and never waits for
the API. Objects are the API's JSON (plain dicts), so the same helper serves core types and
API groups the client has no models for (``resource.k8s.io`` versions).

``list_call`` is a list function of the real ``kubernetes`` client, e.g.
``CoreV1Api.list_pod_for_all_namespaces`` or
``functools.partial(CustomObjectsApi.list_cluster_custom_object, group, version, plural)``;
it is called with ``field_selector``, ``watch``, ``resource_version``, ``timeout_seconds``,
``allow_watch_bookmarks``, ``_preload_content=False`` and ``_request_timeout``.
Cost: one list per (re)start, then O(1) work per event plus ``on_change``.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from exporter.core.extras import require

log = logging.getLogger(__name__)

JsonObj = dict[str, Any]


def import_client(who: str = "the Kubernetes API") -> Any:
    """The ``kubernetes`` package, imported lazily, or :class:`~exporter.core.extras.MissingExtra`
    (one line naming the ``k8s`` extra)."""
    require("kubernetes", who)
    import kubernetes

    return kubernetes


class _Expired(Exception):
    """The watch's resourceVersion is too old (410): list again."""


class Watcher:
    """Keeps ``{uid: object}`` for the objects ``list_call`` returns under ``field_selector``.

    ``what`` names them in logs (``pods``). ``timeout_seconds`` is each watch request's
    server-side length; ``request_timeout`` the connect and list read timeout; after a failure
    the thread waits 1 s, doubling up to ``max_backoff``.
    """

    def __init__(self, what: str, list_call: Callable[..., Any], on_change: Callable[[Mapping[str, JsonObj]], None],
                 field_selector: str = "", timeout_seconds: int = 300, request_timeout: float = 10.0,
                 max_backoff: float = 60.0) -> None:
        self.what = what
        self._list_call = list_call
        self._on_change = on_change
        self.field_selector = field_selector
        self.timeout_seconds = int(timeout_seconds)
        self.request_timeout = float(request_timeout)
        self.max_backoff = float(max_backoff)
        self._objects: dict[str, JsonObj] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._resp: Any = None
        self._lock = threading.Lock()
        self.synced = threading.Event()  # set after the first successful list
        self.errors = 0  # failed list or watch requests (410 Expired is not a failure)
        self.lists = 0  # successful lists (the first one, then one per 410 or failure)
        self._failing = False

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name=f"watch-{self.what}", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            resp = self._resp
        if resp is not None:
            try:
                # shutdown() (urllib3 2.3+) unblocks a read in another thread; close() alone waits for data
                getattr(resp, "shutdown", resp.close)()
            except Exception:  # closing a broken stream may fail; it is gone either way
                log.debug("closing the %s watch failed", self.what, exc_info=True)
        if self._thread is not None:
            self._thread.join(self.request_timeout + 1.0)
        self._thread = None

    # --- background thread ----------------------------------------------------------------------

    def _loop(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                rv = self._list()
                failures = 0
                while not self._stop.is_set():
                    rv = self._watch(rv)
                    if self._failing:
                        self._failing = False
                        log.info("%s watch back", self.what)
            except _Expired:
                continue  # list again at once
            except Exception as exc:  # noqa: BLE001 - nothing may kill the thread; the outage is logged
                if self._stop.is_set():
                    return
                self.errors += 1
                failures += 1
                self._note_failure(exc)
                self._stop.wait(min(2.0 ** (failures - 1), self.max_backoff))

    def _note_failure(self, exc: Exception) -> None:
        status = getattr(exc, "status", None)
        why = f"HTTP {status} {getattr(exc, 'reason', '')}".strip() if status else f"{type(exc).__name__}: {exc}"
        hint = "; the exporter's ServiceAccount needs get, list and watch on " + self.what if status == 403 else ""
        if not self._failing:
            self._failing = True
            log.warning("%s watch failed (%s)%s; retrying with backoff, the last known %s are kept",
                        self.what, why, hint, self.what)
        else:
            log.debug("%s watch still failing (%s)", self.what, why)

    def _request(self, **kw: Any) -> Any:
        if self.field_selector:
            kw["field_selector"] = self.field_selector
        resp = self._list_call(_preload_content=False, **kw)
        with self._lock:
            self._resp = resp
        return resp

    def _list(self) -> str:
        resp = self._request(_request_timeout=(self.request_timeout, self.request_timeout))
        try:
            doc = json.loads(resp.data)
        finally:
            self._release(resp)
        objects = {}
        for obj in doc.get("items") or ():
            uid = _uid(obj)
            if uid:
                objects[uid] = obj
        self._objects = objects
        self.lists += 1
        self._publish()
        self.synced.set()
        return str((doc.get("metadata") or {}).get("resourceVersion") or "")

    def _watch(self, rv: str) -> str:
        from kubernetes.watch.watch import iter_resp_lines

        resp = self._request(watch=True, resource_version=rv, timeout_seconds=self.timeout_seconds,
                             allow_watch_bookmarks=True,
                             _request_timeout=(self.request_timeout, self.timeout_seconds + self.request_timeout))
        try:
            for line in iter_resp_lines(resp):
                if self._stop.is_set():
                    break
                if not line:
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Expired()
                    raise RuntimeError(f"watch error {obj.get('code')}: {obj.get('message')}")
                rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                if kind == "BOOKMARK":
                    continue
                uid = _uid(obj)
                if not uid:
                    continue
                if kind == "DELETED":
                    self._objects.pop(uid, None)
                else:
                    self._objects[uid] = obj
                self._publish()
        finally:
            self._release(resp)
        return rv

    def _release(self, resp: Any) -> None:
        with self._lock:
            self._resp = None
        try:
            resp.release_conn()
        except Exception:  # a closed stream has no connection to give back
            log.debug("release_conn failed", exc_info=True)

    def _publish(self) -> None:
        try:
            self._on_change(dict(self._objects))
        except Exception:  # a consumer bug must not stop the watch
            log.exception("%s watch: consumer failed", self.what)


def _uid(obj: Any) -> str:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    return str(meta.get("uid") or "") if isinstance(meta, dict) else ""


def wait_synced(w: Watcher, timeout: float) -> bool:
    """Whether ``w`` listed within ``timeout`` seconds (start-up; never on the scrape path)."""
    return w.synced.wait(timeout) if timeout > 0 else w.synced.is_set()


__all__ = ["Watcher", "import_client", "wait_synced"]
