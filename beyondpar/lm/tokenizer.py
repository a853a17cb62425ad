"""Text -> token ids for language-model training: by UTF-8 bytes (vocabulary 256, the
paper model's own) or by a tokenizer the user names, read as `beyondpar.pretrained`
reads it (a Hugging Face `tokenizer.json`, a checkpoint folder holding one, or the
vocabulary of a `.gguf` file).

Every tokenizer here has an end-of-document id (`eos_id`) that packing puts between
documents. Bytes use 0 (NUL): text documents never hold it (the corpus readers refuse
files with NUL bytes), so the separator is unambiguous without growing the vocabulary.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from beyondpar.base import checks
from beyondpar.pretrained import hf_folder
from beyondpar.pretrained.gguf import reader

BYTES = "bytes"
# Special tokens that end a document, most common first (tokenizer.json stores no EOS).
EOS_NAMES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "<|im_end|>", "[SEP]")


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255; ids decode back to the exact text."""

    name = BYTES
    vocab_size = 256
    eos_id = 0
    fingerprint = BYTES

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [self.encode(t) for t in texts]

    def decode(self, ids) -> str:
        return bytes(np.asarray(ids, np.uint8)).decode("utf-8", errors="replace")


class NamedTokenizer:
    """A `tokenizers.Tokenizer` with its end-of-document id; `encode` adds no BOS/EOS
    (packing adds the separator itself). `fingerprint` changes with the vocabulary,
    merges or settings, so token shards of another tokenizer are recognised."""

    def __init__(self, tok, name: str, eos_id: int):
        self.tok = tok
        self.name = name
        self.eos_id = int(eos_id)
        self.vocab_size = max(tok.get_vocab_size(with_added_tokens=True), self.eos_id + 1)
        text = tok.to_str() + f"\neos={self.eos_id}"
        self.fingerprint = hashlib.sha256(text.encode()).hexdigest()

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.tok.encode(text, add_special_tokens=False).ids, np.int32)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        found = self.tok.encode_batch(texts, add_special_tokens=False)
        return [np.asarray(e.ids, np.int32) for e in found]

    def decode(self, ids) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=False)


def load(spec: str) -> ByteTokenizer | NamedTokenizer:
    """`"bytes"`, or a path: a `.gguf` file, a `tokenizer.json` (any name) or a folder
    holding `tokenizer.json` or one `.gguf` file."""
    if spec == BYTES:
        return ByteTokenizer()
    path = Path(str(spec)).expanduser()
    if not path.exists():
        raise checks.MissingPathError(
            f"data.tokenizer must be 'bytes' or a tokenizer.json / .gguf path, got {str(spec)!r}"
            " (no such file or folder)"
        )
    gguf = reader.find(path) if not (path / hf_folder.TOKENIZER).is_file() else None
    if gguf is not None:
        source = reader.GgufFile(gguf)
        tok = source.tokenizer()
        return NamedTokenizer(tok, str(gguf), _gguf_eos(source, tok))
    tok = hf_folder.read_tokenizer(path) if path.is_dir() else _read_json_tokenizer(path)
    return NamedTokenizer(tok, str(path), _json_eos(tok, path))


def _read_json_tokenizer(path: Path):
    try:
        return Tokenizer.from_file(str(path))
    except Exception as err:  # tokenizers raises a bare Exception on bad JSON
        raise ValueError(
            f"data.tokenizer must be a tokenizer.json or .gguf file, got {path} ({err})"
        ) from err


def _gguf_eos(source, tok) -> int:
    eos = source.value("tokenizer.ggml.eos_token_id", None)
    return _json_eos(tok, source.path) if eos is None else int(eos)


def _json_eos(tok, path) -> int:
    """The first of `EOS_NAMES` in the vocabulary, else the first special token."""
    vocab = tok.get_vocab(with_added_tokens=True)
    for name in EOS_NAMES:
        if name in vocab:
            return vocab[name]
    special = sorted(i for i, t in tok.get_added_tokens_decoder().items() if t.special)
    if special:
        return special[0]
    raise ValueError(
        f"data.tokenizer {path} must have an end-of-text token (one of {', '.join(EOS_NAMES)} "
        "or any special token) to separate documents, got none"
    )
