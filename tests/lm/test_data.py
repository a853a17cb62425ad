"""What training reads: batches as a pure function of (seed, step), the same global batch
over any number of processes, every window once per epoch, held-out documents never in
training, bits per byte, and one clear error for each bad input."""

import math

import numpy as np
import pytest

from beyondpar.lm import data, packing, speed
from helpers import lm_corpus

SEQ = 32


@pytest.fixture
def loaded(text_folder, tmp_path):
    return data.load(lm_corpus.config(text_folder), seed=3, cache_dir=tmp_path / "work")


def test_default_config_fields():
    assert data.default_data_config().to_dict() == {
        "path": "",
        "format": "auto",
        "text_field": "text",
        "tokenizer": "bytes",
        "heldout_fraction": 0.05,
        "shard_dir": "",
    }


def test_counts_and_bytes_per_token(loaded, texts):
    held = packing.heldout_mask(
        np.asarray([data.shards.split_key(t) for t in texts], np.uint64), 0.05
    )
    assert loaded.vocab_size == 256 and loaded.eos_id == 0
    assert loaded.num_train_documents + loaded.num_heldout_documents == len(texts) == 41
    assert loaded.num_heldout_documents == held.sum() >= 1
    sizes = np.asarray([len(t.encode()) + 1 for t in texts])  # each with its separator
    assert loaded.train_tokens == sizes[~held].sum()
    assert loaded.heldout_tokens == sizes[held].sum()
    assert loaded.bytes_per_token == 1.0
    assert data.bits_per_byte(math.log(2), loaded) == pytest.approx(1.0)


def test_batch_shape_and_dtype(loaded):
    batch = loaded.train_batch(0, 8, SEQ)
    assert batch.shape == (8, SEQ + 1) and batch.dtype == np.int32
    assert batch.min() >= 0 and batch.max() < 256


def test_batches_are_a_function_of_seed_and_step(text_folder, tmp_path, loaded):
    """Step 5 read first, or after steps 0-4, or by another load: the same batch."""
    fresh = data.load(lm_corpus.config(text_folder), seed=3, cache_dir=tmp_path / "work")
    late = fresh.train_batch(5, 4, SEQ)
    for step in range(5):
        loaded.train_batch(step, 4, SEQ)
    np.testing.assert_array_equal(loaded.train_batch(5, 4, SEQ), late)
    other = data.load(lm_corpus.config(text_folder), seed=4, cache_dir=tmp_path / "work")
    assert not np.array_equal(other.train_batch(5, 4, SEQ), late)


@pytest.mark.parametrize("processes", [2, 4])
def test_process_shares_concatenate_to_the_global_batch(loaded, processes):
    for step in (0, 7):
        whole = loaded.train_batch(step, 8, SEQ)
        shares = [loaded.train_batch(step, 8, SEQ, p, processes) for p in range(processes)]
        assert all(s.shape == (8 // processes, SEQ + 1) for s in shares)
        np.testing.assert_array_equal(np.concatenate(shares), whole)


def test_every_window_once_per_epoch_then_reshuffled(loaded):
    """Batches of 5 over 2 epochs (a batch straddles them): each epoch takes every
    window once, in another order; the rows are the windows named."""
    count = loaded.num_windows(SEQ)
    steps = 2 * count // 5 + 1
    seen = np.concatenate([loaded.train_windows(s, 5, SEQ) for s in range(steps)])
    first, second = seen[:count], seen[count : 2 * count]
    assert count == 181
    np.testing.assert_array_equal(np.sort(first), np.arange(count))
    np.testing.assert_array_equal(np.sort(second), np.arange(count))
    assert (first != second).mean() > 0.9
    assert loaded.epoch(count, 5, SEQ) == 5.0 and loaded.epoch(0, 5, SEQ) == 0.0
    stream = loaded.train_stream.astype(np.int32)
    batch = loaded.train_batch(3, 5, SEQ)
    for row, k in zip(batch, loaded.train_windows(3, 5, SEQ), strict=True):
        np.testing.assert_array_equal(row, stream[k * SEQ : k * SEQ + SEQ + 1])


def test_heldout_never_in_training(loaded, texts):
    """Decoded, the two streams are disjoint sets of whole documents covering the corpus."""
    train = {bytes(d).decode() for d in packing.unpack(loaded.train_stream, 0)}
    held = {bytes(d).decode() for d in packing.unpack(loaded.heldout_stream, 0)}
    assert not train & held
    assert train | held == set(texts)
    assert len(held) == loaded.num_heldout_documents


def test_heldout_windows_are_fixed_and_held_out(text_folder, tmp_path, loaded):
    other = data.load(lm_corpus.config(text_folder), seed=9, cache_dir=tmp_path / "work")
    assert loaded.num_heldout_windows(16) == (loaded.heldout_tokens - 1) // 16 == 9
    windows = loaded.heldout_windows(3, 16)
    assert windows.shape == (3, 17) and windows.dtype == np.int32
    np.testing.assert_array_equal(windows, other.heldout_windows(3, 16))
    held = loaded.heldout_stream.astype(np.int32)
    np.testing.assert_array_equal(windows[0], held[:17])


def test_default_corpus_is_real_text_of_a_few_megabytes():
    loaded = data.load(data.default_data_config(), seed=0)
    total = loaded.train_tokens + loaded.heldout_tokens
    docs = loaded.num_train_documents + loaded.num_heldout_documents
    assert 1_000_000 < total - docs <= data.corpus.DEFAULT_CAP_BYTES
    assert docs > 200 and loaded.num_heldout_documents >= 5
    text = bytes(loaded.heldout_windows(1, 4000)[0].astype(np.uint8)).decode(errors="replace")
    assert text.count(" ") > 200  # words, not noise


def test_check_vocab(loaded):
    data.check_vocab(loaded, 256)
    with pytest.raises(
        ValueError,
        match="model vocab_size must be at least the tokenizer's "
        "vocabulary of 256 \\('bytes'\\), got 128",
    ):
        data.check_vocab(loaded, 128)


def test_loader_speed_is_measured(loaded):
    rate = speed.train_batch_tokens_per_second(loaded, 16, SEQ, steps=5)
    assert rate > 1_000_000  # tokens per second on one core; typically tens of millions


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda d: d.train_batch(0, 6, SEQ, 0, 4),
            "batch_size must be a multiple of process_count=4, got 6",
        ),
        (
            lambda d: d.train_batch(0, 4, SEQ, 4, 4),
            "process_index must be < process_count=4, got 4",
        ),
        (lambda d: d.train_batch(-1, 4, SEQ), "step"),
        (lambda d: d.train_batch(0, 4, 10**6), "seq_len must leave at least one window"),
        (lambda d: d.heldout_windows(10**5, SEQ), "count must be at most the"),
    ],
)
def test_bad_batch_arguments(loaded, call, message):
    with pytest.raises(ValueError, match=message):
        call(loaded)
