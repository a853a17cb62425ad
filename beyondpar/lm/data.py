"""What language-model training reads: `load(config.data, seed, cache_dir)` -> `TextData`,
whose `train_batch(step, ...)` is a pure function of (seed, step, batch_size, seq_len)
and whose `heldout_windows` never share a document with training.

The corpus (`data.path`, "" = the built-in default, the Python standard library's own
text: see `beyondpar.lm.corpus`) is tokenized once (`data.tokenizer`: "bytes", or a
tokenizer.json / .gguf path, see `beyondpar.lm.tokenizer`) into token shards cached in
`data.shard_dir`, else `<cache_dir>/tokens-<tag>`, else beside the corpus as
`<path>.tokens-<tag>` (the default corpus without a cache_dir: in memory). Documents are
split by a hash of their text (`beyondpar.lm.packing`), packed with an end-of-document
token, and cut into windows of seq_len + 1 tokens. The batch at `step` is
`order(batch_size, seq_len)[step]`, a grain MapDataset read by random access
(`beyondpar.lm.order`): every epoch reshuffled, resumable at any step with nothing to
save, and process p of P reads rows [p * B/P, (p + 1) * B/P) of the same global batch.
"""

from __future__ import annotations

import hashlib
import math
import os
import sys
from pathlib import Path

import ml_collections
import numpy as np

from beyondpar.base import checks
from beyondpar.lm import corpus, packing, shards, streams, tokenizer
from beyondpar.lm import order as order_lib


def default_data_config() -> ml_collections.ConfigDict:
    """The `data` block of a language-model config."""
    return ml_collections.ConfigDict(
        {
            "path": "",  # "" = the built-in default corpus (Python standard library text)
            "format": "auto",  # "auto" | "text" | "jsonl" | "shards"
            "text_field": "text",  # the document's field in JSON lines
            "tokenizer": "bytes",  # or a path to a tokenizer.json or a .gguf file
            "heldout_fraction": 0.05,
            "shard_dir": "",  # "" = a cache folder under cache_dir, else beside the corpus
        }
    )


class TextData:
    """Packed training and held-out token streams with their batch order."""

    def __init__(self, split: streams.Streams, tok, seed: int):
        self.train_stream = split.train
        self.heldout_stream = split.heldout
        self.tokenizer = tok
        self.seed = seed
        self.vocab_size = int(tok.vocab_size)
        self.eos_id = int(tok.eos_id)
        self.train_tokens = len(split.train)
        self.heldout_tokens = len(split.heldout)
        self.num_train_documents = split.train_documents
        self.num_heldout_documents = split.heldout_documents
        # Each document's separator counts as one byte, as a newline would: with bytes,
        # bytes_per_token is exactly 1 and bits per byte are bits per token.
        self.bytes_per_token = split.heldout_bytes / max(1, self.heldout_tokens)
        self._orders: dict[tuple[int, int], order_lib.BatchOrder] = {}

    def num_windows(self, seq_len: int) -> int:
        return packing.num_windows(self.train_tokens, seq_len)

    def epoch(self, step: int, batch_size: int, seq_len: int) -> float:
        """Passes over the training windows completed before `step` (for logging)."""
        return step * batch_size / self.order(batch_size, seq_len).count

    def order(self, batch_size: int, seq_len: int) -> order_lib.BatchOrder:
        """The training order as a grain MapDataset: `[step]` -> the global batch's
        window indices (window k = train_stream[k * seq_len : k * seq_len + seq_len + 1])."""
        checks.positive_int("batch_size", batch_size)
        checks.positive_int("seq_len", seq_len)
        key = (batch_size, seq_len)
        if key not in self._orders:
            count = self.num_windows(seq_len)
            if count < 1:
                raise ValueError(
                    f"seq_len must leave at least one window of seq_len + 1 tokens in the "
                    f"training split of {self.train_tokens} tokens, got seq_len={seq_len}"
                )
            self._orders[key] = order_lib.BatchOrder(count, batch_size, self.seed)
        return self._orders[key]

    def train_windows(
        self,
        step: int,
        batch_size: int,
        seq_len: int,
        process_index: int = 0,
        process_count: int = 1,
    ) -> np.ndarray:
        """int64 (batch_size // process_count,): this process's windows at `step`."""
        checks.non_negative_int("step", step)
        local = _local_rows(batch_size, process_index, process_count)
        first = step * batch_size + process_index * local
        return self.order(batch_size, seq_len).positions(first, local)

    def train_batch(
        self,
        step: int,
        batch_size: int,
        seq_len: int,
        process_index: int = 0,
        process_count: int = 1,
    ) -> np.ndarray:
        """int32 (batch_size // process_count, seq_len + 1): this process's rows of the
        global batch at `step` (inputs [:, :-1], targets [:, 1:])."""
        picked = self.train_windows(step, batch_size, seq_len, process_index, process_count)
        return packing.windows(self.train_stream, picked * seq_len, seq_len)

    def num_heldout_windows(self, seq_len: int) -> int:
        return packing.num_windows(self.heldout_tokens, seq_len)

    def heldout_windows(self, count: int, seq_len: int) -> np.ndarray:
        """int32 (count, seq_len + 1): held-out windows spread evenly over the held-out
        stream, the same for every seed."""
        checks.positive_int("count", count)
        checks.positive_int("seq_len", seq_len)
        available = self.num_heldout_windows(seq_len)
        if count > available:
            raise ValueError(
                f"count must be at most the {available} held-out windows of seq_len={seq_len} "
                f"({self.heldout_tokens} held-out tokens), got {count}"
            )
        starts = (np.arange(count, dtype=np.int64) * available // count) * seq_len
        return packing.windows(self.heldout_stream, starts, seq_len)


def _local_rows(batch_size: int, process_index: int, process_count: int) -> int:
    checks.positive_int("batch_size", batch_size)
    checks.positive_int("process_count", process_count)
    checks.non_negative_int("process_index", process_index)
    if process_index >= process_count:
        raise ValueError(
            f"process_index must be < process_count={process_count}, got {process_index}"
        )
    if batch_size % process_count:
        raise ValueError(
            f"batch_size must be a multiple of process_count={process_count}, got {batch_size}"
        )
    return batch_size // process_count


def check_vocab(text_data: TextData, model_vocab_size: int) -> None:
    """Refuse a model whose embedding cannot hold every token id of the data."""
    if text_data.vocab_size > model_vocab_size:
        raise ValueError(
            f"model vocab_size must be at least the tokenizer's vocabulary of "
            f"{text_data.vocab_size} ({text_data.tokenizer.name!r}), got {model_vocab_size}"
        )


def load(data_config, seed: int, cache_dir: str | None = None) -> TextData:
    """The corpus of `data_config` tokenized (cached), split and packed for `seed`."""
    checks.non_negative_int("seed", seed)
    for field in ("path", "format", "text_field", "tokenizer", "shard_dir"):
        if not isinstance(data_config[field], str):
            raise ValueError(f"data.{field} must be a string, got {data_config[field]!r}")
    if not data_config.text_field:
        raise ValueError("data.text_field must name the documents' field, got ''")
    fraction = checks.open_unit_interval("data.heldout_fraction", data_config.heldout_fraction)
    path = str(data_config.path)
    fmt = corpus.resolve_format(path, data_config.format)
    tok = tokenizer.load(str(data_config.tokenizer))
    return TextData(_split(data_config, path, fmt, tok, cache_dir, fraction), tok, seed)


def _split(data_config, path: str, fmt: str, tok, cache_dir, fraction: float):
    """The split's streams: memory-mapped beside the token shards, or in memory for a
    corpus with no cache folder (or shards in a folder this process cannot write)."""
    folder = Path(path).expanduser() if fmt == "shards" else None
    if folder is None:
        folder = shard_folder(data_config, path, fmt, tok, cache_dir)
        if folder is None:
            docs = shards.tokenize(corpus.documents(path, fmt, data_config.text_field), tok)
            if docs.num_documents == 0:
                raise ValueError(
                    f"data.path {path!r} must hold at least one document, got none (empty corpus)"
                )
            return streams.in_memory(docs, fraction, tok.eos_id)
        shards.write(path, fmt, data_config.text_field, tok, folder, progress=False)
    index = shards.read_index(folder, tok)
    if not os.access(folder, os.W_OK):
        return streams.in_memory(shards.read(folder)[1], fraction, tok.eos_id)
    with shards.exclusive(folder):
        return streams.on_disk(folder, index, fraction)


def shard_folder(data_config, path: str, fmt: str, tok, cache_dir) -> Path | None:
    """Where the corpus's token shards are cached (None: kept in memory)."""
    if data_config.shard_dir:
        return Path(data_config.shard_dir).expanduser()
    # The default corpus is the running Python's library: another Python, another cache.
    source = Path(path).expanduser().resolve() if path else f"default {sys.version}"
    where = f"{source}\0{fmt}\0{data_config.text_field}"
    tag = hashlib.sha256(f"{where}\0{tok.fingerprint}".encode()).hexdigest()[:12]
    if cache_dir:
        return Path(cache_dir).expanduser() / f"tokens-{tag}"
    if path == corpus.DEFAULT:
        return None
    return Path(f"{Path(path).expanduser()}.tokens-{tag}")


def bits_per_byte(loss_nats: float, text_data: TextData) -> float:
    """A mean cross-entropy per token (nats) in bits per UTF-8 byte of held-out text."""
    return loss_nats / math.log(2) / text_data.bytes_per_token
