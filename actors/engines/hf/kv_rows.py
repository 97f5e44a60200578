"""The hf engine's KV cache: one layer's keys/values in preallocated per-row buffers, and the row operations
continuous batching needs (stacking prefilled rows, merging kept rows right-aligned at a shared column).
Split from `actors.engines.hf.decode`, which schedules the rows."""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer


class RowKVLayer(DynamicLayer):
    """One layer's keys/values in preallocated buffers of shape (rows, kv_heads, capacity, head_dim).

    Each forward writes at column `length` for all rows and attention reads the views `[:, :, :length]`.
    `DynamicLayer.get_mask_sizes` (kv length = cached + new tokens) stays correct for these views.
    """

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.length = 0
        self.key_buffer: torch.Tensor | None = None
        self.value_buffer: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.allocate(key_states.shape[0], key_states, value_states)

    def allocate(self, rows: int, like_keys: torch.Tensor, like_values: torch.Tensor, zeroed: bool = True) -> None:
        """Buffers for `rows` rows, with heads, head dims, dtype and device taken from the `like_*` tensors.

        Zeroed by default: masked columns still enter softmax(QK)V, and 0 * NaN garbage would poison a row.
        `zeroed=False` leaves them uninitialised for a caller that writes or zeroes every column it will read (a
        column at or past `length` is always written by `update` before attention reads it).
        """
        heads = like_keys.shape[1]
        self.dtype, self.device = like_keys.dtype, like_keys.device
        make = torch.zeros if zeroed else torch.empty
        self.key_buffer = make(rows, heads, self.capacity, like_keys.shape[-1], dtype=like_keys.dtype,
                               device=like_keys.device)
        self.value_buffer = make(rows, heads, self.capacity, like_values.shape[-1], dtype=like_values.dtype,
                                 device=like_values.device)
        self.is_initialized = True

    def start_from(self, rows: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Fill the first columns of every row with one sequence's keys/values (shape (1, heads, n, dim)): a shared
        prefix copied into the rows (`actors.engines.hf.shared_prefix`)."""
        self.allocate(rows, keys, values)
        self.set_length(keys.shape[-2])
        self.key_buffer[:, :, : self.length] = keys
        self.value_buffer[:, :, : self.length] = values

    def set_length(self, length: int) -> None:
        self.length = length
        self.keys = self.key_buffer[:, :, :length]
        self.values = self.value_buffer[:, :, :length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self.capacity:
            raise RuntimeError(f"KV buffer overflow: {end} columns needed, capacity {self.capacity}")
        self.key_buffer[:, :, self.length : end] = key_states
        self.value_buffer[:, :, self.length : end] = value_states
        self.set_length(end)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length


def stack_layers(layers: list[RowKVLayer]) -> RowKVLayer:
    """One layer holding the rows of several same-width layers, in order."""
    first = layers[0]
    stacked = RowKVLayer(first.capacity)
    stacked.key_buffer = torch.cat([layer.key_buffer for layer in layers])
    stacked.value_buffer = torch.cat([layer.value_buffer for layer in layers])
    stacked.dtype, stacked.device, stacked.is_initialized = first.dtype, first.device, True
    stacked.set_length(first.length)
    return stacked


def merge_layer(sources: list[tuple[RowKVLayer, list[int], int]], capacity: int, width: int) -> RowKVLayer:
    """Copy the last `w` columns of the kept rows of each source layer, right-aligned at `width`.

    Only the left padding of each source's rows is zeroed: the copied columns are overwritten and the columns
    from `width` on are written by later steps before they are read, so zeroing whole buffers sized for the
    longest remaining completion wrote them twice. (Profiled, the zeroing's time mostly moved to the first write
    of the fresh pages; most of a merge's cost is touching new memory, not the writes themselves.)
    """
    layer = RowKVLayer(capacity)
    first = sources[0][0]
    layer.allocate(sum(len(idx) for _, idx, _ in sources), first.key_buffer, first.value_buffer, zeroed=False)
    start = 0
    for src, idx, w in sources:
        index = torch.tensor(idx, device=src.key_buffer.device)
        stop = start + len(idx)
        layer.key_buffer[start:stop, :, : width - w] = 0
        layer.value_buffer[start:stop, :, : width - w] = 0
        layer.key_buffer[start:stop, :, width - w : width] = src.key_buffer[index, :, src.length - w : src.length]
        layer.value_buffer[start:stop, :, width - w : width] = src.value_buffer[index, :, src.length - w : src.length]
        start = stop
    layer.set_length(width)
    return layer
