"""Bounded caches of what compiles of many layouts share (``search``, ``validate``, ``check``).

A compile of one layout repeats most of the work of the compile before it: the same
captured model goes through the same tensor-parallel pass, the same stage graph is
lowered on the same backend. Each stage of the pipeline keeps what it derived in a
:class:`Memo` keyed by exactly what the value depends on (a graph's identity and a pass's
options, an op's shape and the device, a stage graph and its placements), never by the
layout, so a layout that shares a part with an earlier one reuses it. Values are
computed by the same functions a single compile runs; a cache only skips recomputing
them. Keys hold their graphs alive, so an identity never points at a recycled object.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

V = TypeVar("V")

_MEMOS: list[Memo[object]] = []


@dataclass
class MemoStats:
    name: str
    hits: int
    misses: int
    size: int


class Memo(Generic[V]):
    """A dict with a size bound: past ``maxsize`` entries the oldest half is dropped (first in, first out)."""

    def __init__(self, name: str, maxsize: int = 4096) -> None:
        self.name = name
        self.maxsize = maxsize
        self._data: dict[Hashable, V] = {}
        self.hits = 0
        self.misses = 0
        _MEMOS.append(self)  # type: ignore[arg-type]

    def get(self, key: Hashable, compute: Callable[[], V]) -> V:
        """The value for ``key``, computed by ``compute()`` on a miss."""
        try:
            value = self._data[key]
        except KeyError:
            self.misses += 1
            value = compute()
            self.put(key, value)
            return value
        self.hits += 1
        return value

    def lookup(self, key: Hashable) -> V | None:
        value = self._data.get(key)
        if value is None:
            self.misses += 1
        else:
            self.hits += 1
        return value

    def put(self, key: Hashable, value: V) -> None:
        if len(self._data) >= self.maxsize:
            for old in list(self._data)[: self.maxsize // 2]:
                del self._data[old]
        self._data[key] = value

    def clear(self) -> None:
        self._data.clear()
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._data)


def clear_all() -> None:
    """Empty every cache (benchmarks measuring a cold start; tests that change a backend's data)."""
    for memo in _MEMOS:
        memo.clear()


def stats() -> list[MemoStats]:
    return [MemoStats(m.name, m.hits, m.misses, len(m)) for m in _MEMOS]


class HashedKey:
    """A tuple key hashed once: a search looks the same lowering or unit key up many times, and hashing a
    long nested tuple on every lookup costs more than the lookup itself."""

    __slots__ = ("_hash", "value")

    def __init__(self, value: tuple[Any, ...]) -> None:
        self.value = value
        self._hash = hash(value)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._hash == other._hash and self.value == other.value  # type: ignore[attr-defined]
