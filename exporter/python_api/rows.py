"""Dataclasses whose attributes are rows of the GPU field table (exporter/core/views.py's ``FIELDS``):
``GpuStatus`` and ``GpuRecording`` gain a row's attribute with no edit."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, dataclass_transform

from exporter.core.views import Field

T = TypeVar("T")


@dataclass_transform(frozen_default=True)
def rows_dataclass(rows: Sequence[Field], after: str,
                   row_type: Callable[[Field], object]) -> Callable[[type[T]], type[T]]:
    """A frozen dataclass whose attributes are the class's own and, after its attribute ``after``, one per
    field of ``rows`` (the field table's, exporter/core/views.py), in table order: a row added to the table
    is an attribute with no edit here. The class's annotation of a row's attribute types it for type
    checkers; a row it does not annotate is typed ``row_type(field)``."""

    def make(cls: type[T]) -> type[T]:
        # the class's own annotations, in order, rewritten in place before dataclass() reads them
        annotations: dict[str, Any] = cls.__dict__["__annotations__"]  # noqa: RUF063
        declared = dict(annotations)
        names = [f.name for f in rows]
        own = [(k, v) for k, v in declared.items() if k not in names]
        at = [k for k, _ in own].index(after) + 1
        table = [(f.name, declared.get(f.name, row_type(f))) for f in rows]
        annotations.clear()
        annotations.update([*own[:at], *table, *own[at:]])
        return dataclass(frozen=True)(cls)

    return make
