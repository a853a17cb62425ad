"""Packing: documents end to end with a separator decode back to the documents; the
held-out split by hash keeps a document on one side and never leaves a side empty;
windows share one token; the batch order is a fixed permutation per epoch."""

import numpy as np
import pytest

from beyondpar.lm import order, packing, shards, tokenizer


def tokenized(texts):
    return shards.tokenize(
        [shards.corpus.Document(str(i), t) for i, t in enumerate(texts)], tokenizer.ByteTokenizer()
    )


def test_pack_round_trip(texts):
    docs = tokenized(texts)
    keep = np.arange(len(texts)) % 3 == 0
    stream = packing.pack(docs, keep, 0)
    assert len(stream) == sum(len(t.encode()) + 1 for t, k in zip(texts, keep, strict=True) if k)
    assert stream[-1] == 0
    back = [bytes(d).decode() for d in packing.unpack(stream, 0)]
    assert back == [t for t, k in zip(texts, keep, strict=True) if k]


def test_split_depends_on_the_text_only(texts):
    keys = tokenized(texts).keys
    mask = packing.heldout_mask(keys, 0.25)
    assert mask.sum() == 13 and (~mask).sum() == 28
    shuffled = packing.heldout_mask(keys[::-1], 0.25)[::-1]
    np.testing.assert_array_equal(mask, shuffled)  # the corpus order does not matter
    twice = tokenized(texts + texts[:5]).keys  # a repeated document falls on its side
    np.testing.assert_array_equal(packing.heldout_mask(twice, 0.25)[-5:], mask[:5])
    assert shards.split_key("abc") == 0xEACF018FBF1678BA  # SHA-256, first 8 bytes, little-endian


def test_split_never_leaves_a_side_empty():
    keys = np.asarray([2**63, 2**62, 3 * 2**62], np.uint64)
    assert packing.heldout_mask(keys, 1e-9).tolist() == [False, True, False]
    assert packing.heldout_mask(keys, 1 - 1e-12).tolist() == [True, True, False]


def test_windows_share_one_token():
    stream = np.arange(20, dtype=np.uint8)
    assert packing.num_windows(20, 4) == 4
    got = packing.windows(stream, np.asarray([0, 4, 12]), 4)
    assert got.dtype == np.int32
    assert got.tolist() == [[0, 1, 2, 3, 4], [4, 5, 6, 7, 8], [12, 13, 14, 15, 16]]


def test_order_is_a_fixed_permutation_per_epoch():
    first = order.permutation(1000, seed=5, epoch=0)
    np.testing.assert_array_equal(np.sort(first), np.arange(1000))
    np.testing.assert_array_equal(first, order.permutation(1000, seed=5, epoch=0))
    assert (first != order.permutation(1000, seed=5, epoch=1)).mean() > 0.99
    assert (first != order.permutation(1000, seed=6, epoch=0)).mean() > 0.99
    batches = order.BatchOrder(10, 4, seed=5)
    assert len(batches) > 10**9
    seen = np.concatenate([batches[s] for s in range(5)])  # 20 samples: two epochs
    np.testing.assert_array_equal(seen[:10], order.permutation(10, 5, 0))
    np.testing.assert_array_equal(seen[10:], order.permutation(10, 5, 1))


@pytest.mark.parametrize("fraction", [0.05, 0.5])
def test_split_fraction_is_honoured_on_many_documents(fraction):
    keys = np.asarray([shards.split_key(f"document {i}") for i in range(4000)], np.uint64)
    share = packing.heldout_mask(keys, fraction).mean()
    assert abs(share - fraction) < 0.02
