"""Sample-keyed dropout: the hash is SplitMix64 bit for bit, a sample's mask does not depend on
its neighbours or its row, and the masks keep 1 - p of the elements."""

from __future__ import annotations

import torch
from torch import nn

from shoal.training.dropout import SampleDropout, key_dropout, splitmix64, splitmix64_tensor


def test_the_tensor_hash_is_the_reference_bit_for_bit() -> None:
    values = [0, 1, 2, 12345, 2**31 - 1, 2**62 + 17, -1, -(2**63), 2**63 - 1]
    got = splitmix64_tensor(torch.tensor(values, dtype=torch.int64)).tolist()
    for value, hashed in zip(values, got, strict=True):
        assert hashed & ((1 << 64) - 1) == splitmix64(value & ((1 << 64) - 1)), value


def test_a_sample_gets_its_mask_whichever_row_and_batch_it_is_in() -> None:
    model = nn.Sequential(nn.Linear(4, 64), nn.Dropout(0.5), nn.Linear(64, 2), nn.Dropout(0.5))
    keys = key_dropout(model, seed=7)
    assert keys is not None and isinstance(model[1], SampleDropout)
    x = torch.ones(3, 64)
    keys.step, keys.rows = 4, torch.tensor([5, 9, 2])
    together = model[1](x)
    keys.rows = torch.tensor([2])
    alone = model[1](x[:1])
    assert torch.equal(together[2], alone[0])
    assert not torch.equal(together[0], together[1]), "other samples get other masks"
    assert not torch.equal(model[3](torch.ones(1, 64)), alone), "another layer, another mask"
    keys.step = 5
    assert not torch.equal(model[1](x[:1]), alone), "another step, another mask"


def test_masks_keep_one_minus_p_and_scale_and_evaluation_is_the_identity() -> None:
    dropout = nn.Dropout(0.3)
    keys = key_dropout(dropout, seed=0)
    assert keys is not None
    keys.step, keys.rows = 0, torch.arange(200)
    out = dropout(torch.ones(200, 500))
    kept = out != 0
    assert abs(kept.float().mean().item() - 0.7) < 0.01
    torch.testing.assert_close(out[kept], torch.full_like(out[kept], 1 / 0.7))
    dropout.eval()
    assert torch.equal(dropout(torch.ones(200, 500)), torch.ones(200, 500))
