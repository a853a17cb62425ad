"""Documents -> a held-out split by document -> one token stream per split -> windows.

The split: a document is held out when its key (a hash of its text, `shards.split_key`)
falls in the lowest `heldout_fraction` of the 64-bit range. It depends on the text alone,
not on the seed, the tokenizer or the order of the corpus, so every run over a corpus
holds out the same documents (bits per byte compare across tokenizers and seeds), and
identical documents always fall on the same side: no held-out text is trained on.

Packing: each split's documents, in corpus order, each followed by the end-of-document
token, end to end; window k of length seq_len + 1 starts at token k * seq_len (windows
share one token, so every token but the first is a target exactly once per epoch).
"""

from __future__ import annotations

import numpy as np

from beyondpar.lm.shards import Tokenized

_RANGE = 2.0**64


def heldout_mask(keys: np.ndarray, fraction: float) -> np.ndarray:
    """Which documents are held out. At least one document falls on each side: with no
    key below the cut, the lowest key is held out; with every key below it, the highest
    is trained on."""
    if len(keys) < 2:
        raise ValueError(
            "data.path must hold at least 2 documents (one to train on, one held out), "
            f"got {len(keys)}"
        )
    mask = keys.astype(np.float64) < fraction * _RANGE
    if not mask.any():
        mask[np.argmin(keys)] = True
    if mask.all():
        mask[np.argmax(keys)] = False
    return mask


def pack(docs: Tokenized, keep: np.ndarray, eos_id: int) -> np.ndarray:
    """The kept documents' tokens end to end, each followed by `eos_id`."""
    per_token = np.repeat(keep, docs.lengths)
    body = np.asarray(docs.tokens)[per_token]
    ends = np.cumsum(docs.lengths[keep])
    return np.insert(body, ends, np.asarray(eos_id, body.dtype))


def num_windows(stream_length: int, seq_len: int) -> int:
    return max(0, (stream_length - 1) // seq_len)


def windows(stream: np.ndarray, starts: np.ndarray, seq_len: int) -> np.ndarray:
    """int32 (len(starts), seq_len + 1): the windows of `stream` starting at `starts`."""
    index = np.asarray(starts, np.int64)[:, None] + np.arange(seq_len + 1)
    return stream[index].astype(np.int32)


def unpack(stream: np.ndarray, eos_id: int) -> list[np.ndarray]:
    """The documents of a packed stream (the inverse of `pack`)."""
    ends = np.flatnonzero(stream == eos_id)
    return [part[:-1] for part in np.split(stream, ends + 1)[:-1]]
