"""Cascade attention over shared prefixes (actors/engines/hf/prefix_attention.py) against plain SDPA over the whole columns."""

from __future__ import annotations

import types

import pytest
import torch

from actors.engines.hf.prefix_attention import PrefixGroup, prefix_attention, prefix_groups_active
from actors.engines.hf.shared_prefix import hold_prefix

KV, REP, DIM = 2, 3, 8


def sdpa_reference(query, keys, values, mask):
    """SDPA over [prefix | own columns] with the GQA heads repeated: what the rows computed before."""
    keys, values = keys.repeat_interleave(REP, 1), values.repeat_interleave(REP, 1)
    out = torch.nn.functional.scaled_dot_product_attention(query, keys, values, attn_mask=mask)
    return out.transpose(1, 2)


@pytest.mark.parametrize("q_len", [1, 4])
def test_two_prefix_groups_and_a_row_without_one_match_sdpa_on_whole_columns(q_len):
    torch.manual_seed(0)
    rows, own, lengths = 5, 6, (7, 4)
    query = torch.randn(rows, KV * REP, q_len, DIM, dtype=torch.float64)
    key, value = torch.randn(rows, KV, own, DIM, dtype=torch.float64), torch.randn(rows, KV, own, DIM, dtype=torch.float64)
    prefixes = [(torch.randn(1, KV, n, DIM, dtype=torch.float64), torch.randn(1, KV, n, DIM, dtype=torch.float64))
                for n in lengths]
    # row 0 is left-padded by two columns; causal over the own columns, the prefix fully visible
    own_mask = torch.ones(rows, 1, q_len, own, dtype=torch.bool).tril(own - q_len)
    own_mask[0, :, :, :2] = False
    membership = {0: 0, 1: 1, 2: 0, 4: 1}  # row 3 shares no prefix
    groups = [PrefixGroup(torch.tensor([r for r, g in membership.items() if g == k]), [p[0]], [p[1]])
              for k, p in enumerate(prefixes)]
    module = types.SimpleNamespace(layer_idx=0)
    with prefix_groups_active(groups):
        out, _ = prefix_attention(module, query, key, value, own_mask)
    assert out.shape == (rows, q_len, KV * REP, DIM) and out.dtype == query.dtype
    for r in range(rows):
        g = membership.get(r)
        keys, values, mask = key[r : r + 1], value[r : r + 1], own_mask[r : r + 1]
        if g is not None:
            pk, pv = prefixes[g]
            keys, values = torch.cat([pk, keys], 2), torch.cat([pv, values], 2)
            mask = torch.cat([torch.ones(1, 1, q_len, pk.shape[2], dtype=torch.bool), mask], -1)
        expected = sdpa_reference(query[r : r + 1], keys, values, mask)
        torch.testing.assert_close(out[r : r + 1], expected, rtol=1e-5, atol=1e-6)


def test_outside_a_decode_forward_it_is_sdpa_itself():
    torch.manual_seed(1)
    query = torch.randn(2, KV * REP, 3, DIM)
    key, value = torch.randn(2, KV, 3, DIM), torch.randn(2, KV, 3, DIM)
    module = types.SimpleNamespace(layer_idx=0, num_key_value_groups=REP, is_causal=True)
    out, _ = prefix_attention(module, query, key, value, None)
    expected = torch.nn.functional.scaled_dot_product_attention(
        query, key.repeat_interleave(REP, 1), value.repeat_interleave(REP, 1), is_causal=True).transpose(1, 2)
    torch.testing.assert_close(out, expected)


def test_a_padding_query_that_sees_none_of_its_columns_stays_finite():
    # a left pad's query in a row without prefix has nothing to attend to: zeros, never NaN (NaN keys/values
    # written for a pad column would poison every later step of the batch through 0 * NaN)
    query = torch.randn(1, KV * REP, 2, DIM)
    key, value = torch.randn(1, KV, 2, DIM), torch.randn(1, KV, 2, DIM)
    mask = torch.tensor([[[[False, False], [False, True]]]])
    prefix = (torch.randn(1, KV, 3, DIM), torch.randn(1, KV, 3, DIM))
    other_rows = PrefixGroup(torch.tensor([], dtype=torch.long), [prefix[0]], [prefix[1]])  # none of this row
    with prefix_groups_active([other_rows]):
        out, _ = prefix_attention(types.SimpleNamespace(layer_idx=0), query, key, value, mask)
    assert torch.isfinite(out).all() and (out[0, 0] == 0).all()


def test_a_prefix_is_held_once_only_where_it_saves_enough_attention():
    assert hold_prefix(640, 64, 2048)  # a judge's rubric over 64 rows: 63 x 640 = 40,320 columns per step
    assert not hold_prefix(70, 3, 2048)  # one sentence asked of three samplers: 140, copied
    assert hold_prefix(1024, 3, 2048) and not hold_prefix(1023, 3, 2048)  # the boundary: 2 x 1024
    assert hold_prefix(70, 3, 0)  # 0 = always held
