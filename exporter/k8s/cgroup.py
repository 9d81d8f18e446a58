"""Which pod and container a process belongs to, from its cgroup (``/proc/<pid>/cgroup``).

The kubelet puts each pod in a cgroup named after the pod UID and the runtime puts each
container in one named after the container ID; the path formats differ by cgroup version,
cgroup driver and runtime (tests/fixtures/cgroup/ has one real-format file per case):

- cgroup v1 (``N:controllers:/path`` lines) and v2 (one ``0::/path`` line): the same paths;
- cgroupfs driver: ``/kubepods[/burstable|/besteffort]/pod<uid>/<container id>``
  (containerd; CRI-O names the container ``crio-<id>``);
- systemd driver: ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid with
  _ for ->.slice/cri-containerd-<id>.scope`` (containerd), ``crio-<id>.scope`` (CRI-O),
  ``docker-<id>.scope`` (cri-dockerd); kind's ``kubelet.slice/kubelet-kubepods...`` too;
- read from inside a private cgroup namespace the path is relative (``/../../kubepods...``):
  components are matched wherever they are.

A process whose cgroup names no pod (a host process, a system daemon, ``crio-conmon-<id>``)
gives ``None``: it is outside any pod. Never guessed from anything else.

Only the kubelet's own components count: the first ``pod<uid>`` and its direct child (the
container); a child cgroup a container made itself (``pod<victim>/<victim container>``) is
ignored, and :class:`exporter.k8s.processes.PodIndex` takes a container ID only when the API
says it belongs to that pod.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Literal

# pod<uid>: a UUID (dashes; systemd escapes them as _) or a static pod's 32-hex config hash
_POD = re.compile(r"(?:^|[-_])pod([0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_]"
                  r"[0-9a-fA-F]{12}|[0-9a-fA-F]{32})(?:\.slice)?$")
# the container: <id>, cri-containerd-<id>.scope, crio-<id>[.scope], docker-<id>.scope, cri-o-<id>
_CONTAINER = re.compile(r"(?:(?:cri-containerd|crio|cri-o|docker|containerd)[-:])?([0-9a-f]{64})(?:\.scope)?$")


@dataclass(frozen=True)
class CgroupRef:
    """What a cgroup path says: the pod UID (dashed, lower case) and the container ID, either may be ''."""

    pod_uid: str
    container_id: str


def parse_path(path: str) -> CgroupRef | None:
    """The pod and container a cgroup path names, or None when it names neither.

    Trust boundary: below a pod's cgroup, a process that can create cgroups (privileged, DinD,
    systemd in a container) can name children whatever it likes, e.g. ``pod<victim uid>/<victim
    container id>``. Only what the kubelet and the runtime created counts: the *first* ``pod<uid>``
    component, and the container ID only as that component's direct child. Anything deeper is the
    container's own business and never changes the answer.
    """
    pod = cid = ""
    for part in path.split("/"):
        if not part or part == "..":
            continue
        if pod:  # the pod's direct child: its container, or not a container at all
            if part.startswith("crio-conmon-"):
                return None  # CRI-O's monitor process: not the container
            m = _CONTAINER.fullmatch(part)
            cid = m.group(1) if m is not None else ""
            break  # deeper components are the container's own children: never trusted
        m = _POD.search(part)
        if m is not None and (part.startswith("pod") or part.endswith(".slice")):
            pod = _uid(m.group(1))
    if not pod:
        return None
    return CgroupRef(pod, cid)


def parse(text: str) -> CgroupRef | None:
    """The pod and container of a ``/proc/<pid>/cgroup`` file (v1 or v2 lines), or None.

    The v2 line (``0::``) wins; else the first v1 controller line that names a pod.
    """
    best: CgroupRef | None = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        ref = parse_path(parts[2].strip())
        if ref is None:
            continue
        if parts[0] == "0" and parts[1] == "":
            return ref
        if best is None or (not best.container_id and ref.container_id):
            best = ref
    return best


def read(proc_root: str, pid: int) -> CgroupRef | Literal[False] | None:
    """``parse`` of ``<proc_root>/<pid>/cgroup``; False when the process cannot be read (gone, or no access)."""
    try:
        # os.open/os.read: a buffered text file costs four times as much for this one small read
        fd = os.open(os.path.join(proc_root, str(int(pid)), "cgroup"), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        data = os.read(fd, 65536)
    except OSError:
        return False
    finally:
        os.close(fd)
    return parse(data.decode("utf-8", "replace"))


def _uid(raw: str) -> str:
    """Dashed lower case (systemd escapes ``-`` as ``_``); a static pod's 32-hex hash stays as is."""
    return raw.replace("_", "-").lower()
