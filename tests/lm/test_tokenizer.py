"""Tokenizers for text training: bytes, a tokenizer.json built here with `tokenizers`,
and GGUF vocabularies (the small test files, and SmolLM2's where installed)."""

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from beyondpar.lm import data, tokenizer
from helpers import lm_corpus
from helpers.paths import DATA, SMOLLM2_GGUF, needs_smollm2

TEXT = "Hello world, naïve café – 東京 ½\n\tend."


def train_tokenizer(path, texts, special=("<|endoftext|>",)):
    """A byte-level BPE of vocabulary 300 trained on `texts`, saved as tokenizer.json."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=list(special),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.save(str(path))
    return path


@pytest.fixture
def json_tokenizer(tmp_path, texts):
    return train_tokenizer(tmp_path / "tokenizer.json", texts)


def test_bytes_round_trip():
    tok = tokenizer.load("bytes")
    ids = tok.encode(TEXT)
    assert ids.dtype == np.int32 and len(ids) == len(TEXT.encode()) == 45
    assert ids[:5].tolist() == [72, 101, 108, 108, 111]
    assert tok.decode(ids) == TEXT
    assert (tok.vocab_size, tok.eos_id) == (256, 0)


def test_json_tokenizer_round_trip(json_tokenizer):
    tok = tokenizer.load(str(json_tokenizer))
    ids = tok.encode(TEXT)
    assert tok.decode(ids) == TEXT
    assert tok.vocab_size == 300 and tok.eos_id == 0  # the first special token trained
    assert len(ids) < len(TEXT.encode())  # merges learnt from the corpus apply
    folder = tokenizer.load(str(json_tokenizer.parent))  # a folder holding tokenizer.json
    assert folder.fingerprint == tok.fingerprint != "bytes"


def test_json_tokenizer_trains_with_bits_per_byte(json_tokenizer, text_folder, tmp_path, texts):
    cfg = lm_corpus.config(text_folder, tokenizer=str(json_tokenizer))
    loaded = data.load(cfg, seed=0, cache_dir=tmp_path / "work")
    assert loaded.vocab_size == 300 and loaded.eos_id == 0
    held = [bytes(t.encode()) for t in texts]
    decoded = [loaded.tokenizer.decode(d) for d in data.packing.unpack(loaded.heldout_stream, 0)]
    assert all(d.encode() in held for d in decoded)
    held_bytes = sum(len(d.encode()) + 1 for d in decoded)
    assert loaded.bytes_per_token == pytest.approx(held_bytes / loaded.heldout_tokens)
    assert loaded.bytes_per_token == pytest.approx(74 / 51)  # this trained BPE
    data.check_vocab(loaded, 300)
    with pytest.raises(ValueError, match="at least the tokenizer's vocabulary of 300"):
        data.check_vocab(loaded, 256)


def test_gguf_vocabularies_round_trip():
    bpe = tokenizer.load(str(DATA / "gguf_tokenizer" / "bpe.gguf"))
    assert bpe.vocab_size == 902 and bpe.decode(bpe.encode(TEXT)) == TEXT
    spm = tokenizer.load(str(DATA / "gguf_tokenizer" / "spm.gguf"))
    assert (spm.vocab_size, spm.eos_id) == (640, 2)
    assert spm.decode(spm.encode("Hello world, café")) == "Hello world, café"


@needs_smollm2
def test_smollm2_gguf_vocabulary():
    tok = tokenizer.load(str(SMOLLM2_GGUF))
    assert (tok.vocab_size, tok.eos_id) == (49152, 2)
    assert tok.encode("Hello world, café").tolist() == [19556, 905, 28, 37366]
    assert tok.decode(tok.encode(TEXT)) == TEXT


def test_tokenizer_without_an_end_token_is_refused(tmp_path, texts):
    path = train_tokenizer(tmp_path / "plain.json", texts, special=())
    with pytest.raises(ValueError, match="must have an end-of-text token"):
        tokenizer.load(str(path))


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("missing.json", "data.tokenizer must be 'bytes' or a tokenizer.json / .gguf path"),
        ("bad.json", "data.tokenizer must be a tokenizer.json or .gguf file, got"),
    ],
)
def test_bad_tokenizer_paths(tmp_path, name, message):
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match=message):
        tokenizer.load(str(tmp_path / name))
