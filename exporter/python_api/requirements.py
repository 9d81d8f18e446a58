"""How many GPUs a parallel run needs, and how much memory each (:func:`estimate_requirements`)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from exporter.core.views import MIB
from exporter.python_api.checks import short_repr

PARALLEL_KEYS: dict[str, tuple[str, ...]] = {
    "tp": ("tensor_parallel_size", "tp_size", "tp"),
    "pp": ("pipeline_parallel_size", "pp_size", "pp"),
    "dp": ("data_parallel_size", "dp_size", "dp"),
    "cp": ("context_parallel_size", "cp_size", "cp"),
    "dcp": ("decode_context_parallel_size", "dcp_size", "dcp"),
}
_SPELLING = {s: dim for dim, spellings in PARALLEL_KEYS.items() for s in spellings}
MAX_DEPTH = 32
# memory per GPU by model size (parameters, read from the model name): the autotuner's tiers
MEMORY_TIERS = ((65e9, 20_000 * MIB), (7e9, 12_000 * MIB), (0.0, 8_000 * MIB))
_PARAMS = re.compile(r"(?<![0-9a-z.])(\d+(?:\.\d+)?)b(?![a-z0-9])")


@dataclass(frozen=True)
class Requirements:
    """What a parallel run needs: ``gpus`` = tp x pp x max(dp, cp, dcp), and the free memory each
    GPU should have (bytes). ``parallelism``: the size of each dimension (1 when not given)."""

    gpus: int
    memory_per_gpu_bytes: int
    parallelism: dict[str, int]


def _positive(v: object, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int | float | str):
        raise ValueError(f"{where}={short_repr(v)}: expected a positive integer or a list of them")
    try:
        f = float(v)
    except (ValueError, OverflowError):
        f = math.nan
    if not (math.isfinite(f) and f.is_integer() and 1 <= f <= 1 << 20):
        raise ValueError(f"{where}={short_repr(v)}: expected a positive integer or a list of them")
    return int(f)


def _dimension(v: object, where: str) -> int:
    """A size, a list of sizes (its largest counts), or the autotuner's {"values": [...]}."""
    if isinstance(v, Mapping) and "values" in v:
        v, where = v["values"], f"{where}.values"
    if isinstance(v, list | tuple):
        if not v:
            raise ValueError(f"{where}=[]: expected a positive integer or a non-empty list of them")
        return max(_positive(x, f"{where}[{i}]") for i, x in enumerate(v))
    return _positive(v, where)


def parallelism(config: object, source: str = "task_config") -> tuple[dict[str, int], set[str]]:
    """The size of each dimension, searched at every depth; also which dimensions were given.

    A dimension given twice with different values is an error; a missing one is 1.
    """
    found: dict[str, tuple[int, str]] = {}
    stack: list[tuple[object, str, int]] = [(config, "", 0)]
    while stack:
        node, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ValueError(f"{source}: nested deeper than {MAX_DEPTH} levels at {path[:60]}")
        items: Iterable[tuple[str, object]]
        if isinstance(node, Mapping):
            items = ((str(k), v) for k, v in node.items())
        elif isinstance(node, list | tuple):
            items = ((f"[{i}]", v) for i, v in enumerate(node))
        else:
            continue
        children = []
        for k, v in items:
            where = f"{path}.{k}" if path and not k.startswith("[") else f"{path}{k}"
            dim = _SPELLING.get(k.lower().replace("-", "_"))
            if dim is None or (isinstance(v, Mapping) and "values" not in v):
                children.append((v, where, depth + 1))
                continue
            try:
                n = _dimension(v, where)
            except ValueError as exc:
                raise ValueError(f"{source}: {exc}") from None
            if dim in found and found[dim][0] != n:
                raise ValueError(f"{source}: {dim} is given twice with different values "
                                 f"({found[dim][1]}={found[dim][0]}, {where}={n})")
            found.setdefault(dim, (n, where))
        stack.extend(reversed(children))
    return {dim: found[dim][0] if dim in found else 1 for dim in PARALLEL_KEYS}, set(found)


def world_size(sizes: Mapping[str, int]) -> int:
    """tp x pp x max(dp, cp, dcp): data and context parallel ranks share the GPUs of one replica."""
    return sizes["tp"] * sizes["pp"] * max(sizes["dp"], sizes["cp"], sizes["dcp"])


def _model_name(config: Mapping[str, Any]) -> str:
    model = config.get("model")
    if isinstance(model, Mapping):
        model = model.get("id_or_path") or model.get("id") or model.get("name") or model.get("path")
    return model if isinstance(model, str) else ""


def estimate_requirements(task_config: Mapping[str, Any]) -> Requirements:
    """GPUs and memory per GPU for an autotuner task (or any serving config).

    The parallel sizes are read at any depth (``parameters: {"tp-size": [1, 2, 4]}`` works; a list
    counts as its largest value, as does ``{"type": "choice", "values": [...]}``); spellings
    ``tensor-parallel-size``, ``tp-size``, ``tp_size``, ``tp`` and likewise for pp, dp, cp and dcp.
    The memory per GPU follows the model size read from ``model`` (``id_or_path``): 20,000 MiB
    from 65B parameters, 12,000 MiB from 7B, else 8,000 MiB.
    """
    if not isinstance(task_config, Mapping):
        raise TypeError(f"task_config: expected a mapping (dict), got {type(task_config).__name__}")
    sizes, _ = parallelism(task_config)
    gpus = world_size(sizes)
    m = _PARAMS.search(_model_name(task_config).lower())
    params = float(m.group(1)) * 1e9 if m else 0.0
    memory = next(b for floor, b in MEMORY_TIERS if params >= floor)
    return Requirements(gpus=gpus, memory_per_gpu_bytes=memory, parallelism=sizes)
