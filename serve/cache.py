"""The GRM replica's in-memory response cache: judge completions by request key, least recently used evicted first."""

from __future__ import annotations

import collections

from actors.engines.base import Completion


class LRUCache:
    """Completions by request key, least recently used evicted first; capacity 0 disables it."""

    def __init__(self, capacity: int = 0):
        self.capacity = capacity
        self.hits = self.misses = 0
        self._data: collections.OrderedDict[str, Completion] = collections.OrderedDict()

    def get(self, key: str) -> Completion | None:
        if key in self._data:
            self._data.move_to_end(key)
            self.hits += 1
            return self._data[key]
        self.misses += 1
        return None

    def put(self, key: str, value: Completion) -> None:
        if self.capacity <= 0 or value.finish_reason == "error":
            return
        self._data[key] = value
        self._data.move_to_end(key)
        self.resize(self.capacity)

    def resize(self, capacity: int) -> None:
        self.capacity = capacity
        while len(self._data) > max(capacity, 0):
            self._data.popitem(last=False)

    def clear(self) -> None:
        self._data.clear()

    def __len__(self) -> int:
        return len(self._data)
