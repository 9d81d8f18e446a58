"""A fake kubelet pod-resources endpoint: a real gRPC server on a unix socket.

It serves ``v1.PodResourcesLister/List`` with a canned answer the test sets, and can
misbehave the way a real kubelet does: hang (answer nothing until released), die (stop
and remove the socket, or leave a stale socket file nobody listens on) and come back.

The canned answer is either a ``ListPodResourcesResponse`` or raw bytes (to send fields a
newer kubelet has and our trimmed .proto lacks). Devices allocated through Dynamic Resource
Allocation go into ``ContainerResources.dynamic_resources`` (``claims=`` of :func:`pod`), as a
1.34+ kubelet with ``KubeletPodResourcesDynamicResources`` sends them.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from exporter.k8s.proto import podresources_pb2 as pb

LIST_METHOD = "List"
SERVICE = "v1.PodResourcesLister"

# container name -> [(resource name, [device IDs])]
Containers = Mapping[str, Sequence[tuple[str, Sequence[str]]]]
# one DRA device of a claim: (driver, pool, device name), or with a share id as a fourth item
ClaimDevice = tuple[str, str, str] | tuple[str, str, str, str]
# container name -> [(claim name, claim namespace, [devices])]
Claims = Mapping[str, Sequence[tuple[str, str, Sequence[ClaimDevice]]]]


def claim_resource(dev: ClaimDevice) -> pb.ClaimResource:
    cr = pb.ClaimResource(driver_name=dev[0], pool_name=dev[1], device_name=dev[2])
    if len(dev) == 4:
        cr.share_id = dev[3]
    return cr


def pod(namespace: str, name: str, containers: Containers, claims: Claims | None = None) -> pb.PodResources:
    """One pod entry of a List answer; ``claims`` adds DRA devices (``dynamic_resources``)."""
    claims = claims or {}
    return pb.PodResources(
        name=name,
        namespace=namespace,
        containers=[
            pb.ContainerResources(
                name=cname,
                devices=[pb.ContainerDevices(resource_name=res, device_ids=list(ids))
                         for res, ids in containers.get(cname, ())],
                dynamic_resources=[
                    pb.DynamicResource(claim_name=cn, claim_namespace=cns,
                                       claim_resources=[claim_resource(d) for d in devs])
                    for cn, cns, devs in claims.get(cname, ())],
            )
            for cname in dict.fromkeys([*containers, *claims])
        ],
    )


def response(pods: Iterable[pb.PodResources]) -> pb.ListPodResourcesResponse:
    return pb.ListPodResourcesResponse(pod_resources=list(pods))


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def raw_field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (wire type 2), for hand-built messages."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


class FakeKubelet:
    """``with FakeKubelet() as k: k.set_response(...)``; ``k.path`` is the socket for the exporter."""

    def __init__(self, socket_dir: Path | None = None) -> None:
        # A short directory: unix socket paths are limited to 107 bytes, pytest's tmp_path can be longer.
        self._own_dir = socket_dir is None
        self.dir = Path(tempfile.mkdtemp(prefix="kubelet-")) if socket_dir is None else socket_dir
        self.path = str(self.dir / "kubelet.sock")
        self._lock = threading.Lock()
        self._response: pb.ListPodResourcesResponse | bytes = pb.ListPodResourcesResponse()
        self._hanging = False
        self._waiters: set[threading.Event] = set()
        self._server: Any = None
        self._stale: socket.socket | None = None
        self.calls = 0  # List calls answered
        self.hung = 0  # List calls currently held by hang()

    # --- control --------------------------------------------------------------------------

    def start(self) -> FakeKubelet:
        """Serve on ``path`` (also "come back" after :meth:`die`)."""
        self._drop_stale()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="fake-kubelet"),
                             options=[("grpc.max_send_message_length", -1)])
        handler = grpc.method_handlers_generic_handler(SERVICE, {
            LIST_METHOD: grpc.unary_unary_rpc_method_handler(
                self._list,
                request_deserializer=pb.ListPodResourcesRequest.FromString,
                response_serializer=self._serialize,
            ),
        })
        server.add_generic_rpc_handlers((handler,))
        if server.add_insecure_port(f"unix://{self.path}") == 0:
            raise RuntimeError(f"fake kubelet: cannot bind {self.path}")
        server.start()
        self._server = server
        return self

    def set_response(self, resp: pb.ListPodResourcesResponse | bytes) -> None:
        with self._lock:
            self._response = resp

    def hang(self) -> None:
        """From now on List calls get no answer until :meth:`unhang` (or the client gives up)."""
        with self._lock:
            self._hanging = True

    def unhang(self) -> None:
        with self._lock:
            self._hanging = False
            waiters = list(self._waiters)
        for ev in waiters:
            ev.set()

    def die(self, stale_socket: bool = False) -> None:
        """Stop serving and remove the socket; ``stale_socket``: leave a socket file nobody accepts on."""
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace=None).wait(5)  # cancels held calls: their clients see an error, no answer
        self.unhang()
        if os.path.lexists(self.path):
            os.unlink(self.path)
        if stale_socket:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.bind(self.path)  # bound, never listening: connect() is refused, like a dead kubelet's socket
            self._stale = s

    def stop(self) -> None:
        self.die()
        self._drop_stale()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> FakeKubelet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- server side ----------------------------------------------------------------------

    def _drop_stale(self) -> None:
        if self._stale is not None:
            self._stale.close()
            self._stale = None
            if os.path.lexists(self.path):
                os.unlink(self.path)

    @staticmethod
    def _serialize(resp: pb.ListPodResourcesResponse | bytes) -> bytes:
        return resp if isinstance(resp, bytes) else resp.SerializeToString()

    def _list(self, request: pb.ListPodResourcesRequest, context: grpc.ServicerContext) -> Any:
        with self._lock:
            hanging = self._hanging
            if hanging:
                ev = threading.Event()
                self._waiters.add(ev)
                self.hung += 1
        if hanging:
            # Released by unhang()/die(), or when the client's deadline ends the RPC.
            context.add_callback(ev.set)
            ev.wait()
            with self._lock:
                self._waiters.discard(ev)
                self.hung -= 1
                still = self._hanging
            if still or not context.is_active():
                return pb.ListPodResourcesResponse()  # the client has gone; nobody reads this
        with self._lock:
            self.calls += 1
            return self._response
