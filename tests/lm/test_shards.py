"""Token shards: written once, read back as the in-memory tokenization, resumed after a
kill without redoing finished shards, refused when made from another tokenizer or
corpus; and launch/tokenize.py, which writes them."""

import subprocess
import sys
import threading

import numpy as np
import pytest

from beyondpar.lm import corpus, data, shards, streams, tokenizer
from helpers import lm_corpus
from helpers.paths import ROOT


class Counting:
    """The byte tokenizer, counting its batches; raises KeyboardInterrupt (as a kill
    would stop it) on batch number `stop_at`."""

    def __init__(self, stop_at=None):
        self.inner, self.calls, self.stop_at = tokenizer.ByteTokenizer(), 0, stop_at
        for name in ("name", "vocab_size", "eos_id", "fingerprint", "encode", "decode"):
            setattr(self, name, getattr(self.inner, name))

    def encode_batch(self, texts):
        self.calls += 1
        if self.calls == self.stop_at:
            raise KeyboardInterrupt
        return self.inner.encode_batch(texts)


def write(folder, out, tok, **kwargs):
    return shards.write(
        str(folder), "auto", "text", tok, out, shard_documents=8, progress=False, **kwargs
    )


def test_shards_read_back_as_the_corpus(text_folder, tmp_path, texts):
    out = write(text_folder, tmp_path / "shards", Counting())
    index, tokens = shards.read(out, tokenizer.ByteTokenizer())
    assert (index["num_shards"], index["documents"], index["complete"]) == (6, 41, True)
    assert sorted(p.name for p in out.iterdir())[:4] == [
        ".lock",
        "index.json",
        "shard_00000.json",
        "shard_00000.npy",
    ]
    assert tokens.tokens.dtype == np.uint8
    assert bytes(tokens.tokens).decode() == "".join(texts)
    assert tokens.lengths.tolist() == [len(t.encode()) for t in texts]
    memory = shards.tokenize(corpus.documents(str(text_folder), "auto"), tokenizer.ByteTokenizer())
    np.testing.assert_array_equal(memory.keys, tokens.keys)


def test_resume_after_a_kill_keeps_finished_shards(text_folder, tmp_path):
    out = tmp_path / "shards"
    with pytest.raises(KeyboardInterrupt):
        write(text_folder, out, Counting(stop_at=4))  # dies tokenizing shard 3
    assert sorted(p.name for p in out.glob("shard_*.json")) == [
        f"shard_0000{i}.json" for i in range(3)
    ]
    assert not shards.files.read_json(out / "index.json")["complete"]
    with pytest.raises(ValueError, match="must hold finished token shards, got unfinished"):
        shards.read(out)
    # a kill between a shard's two files, and a temporary file of a killed write
    (out / "shard_00003.npy").write_bytes(b"half")
    (out / ".shard_00004.npy.tmp").write_bytes(b"half")
    again = Counting()
    write(text_folder, out, again)
    assert again.calls == 3  # shards 3, 4, 5 only
    assert not list(out.glob(".shard_*"))
    whole = write(text_folder, tmp_path / "whole", Counting())
    for name in ("tokens", "lengths", "num_bytes", "keys"):
        np.testing.assert_array_equal(
            getattr(shards.read(out)[1], name), getattr(shards.read(whole)[1], name)
        )
    finished = Counting()
    write(text_folder, out, finished)
    assert finished.calls == 0


def test_other_tokenizer_or_corpus_is_refused(text_folder, tmp_path):
    out = write(text_folder, tmp_path / "shards", Counting())
    gguf = tokenizer.load(str(lm_corpus.DATA / "gguf_tokenizer" / "bpe.gguf"))
    with pytest.raises(
        ValueError,
        match=r"holds token shards of another tokenizer: expected tokenizer '.*bpe.gguf'",
    ):
        write(text_folder, out, gguf)
    (text_folder / "doc_000.txt").write_text("changed")
    with pytest.raises(
        ValueError,
        match=r"another corpus: expected corpus '.*corpus \(\w{12}\)', got '.*corpus \(\w{12}\)'",
    ):
        write(text_folder, out, Counting())
    with pytest.raises(
        ValueError,
        match="data.tokenizer must be the tokenizer the shards .* were made with, 'bytes'",
    ):
        shards.read(out, gguf)


def test_training_from_shards_equals_training_from_text(text_folder, tmp_path):
    out = write(text_folder, tmp_path / "shards", Counting())
    direct = data.load(lm_corpus.config(text_folder), seed=1)
    sharded = data.load(lm_corpus.config(out), seed=1)
    assert direct.num_heldout_documents == sharded.num_heldout_documents
    np.testing.assert_array_equal(direct.train_batch(2, 4, 16), sharded.train_batch(2, 4, 16))


def test_shards_are_not_tokenized_again(text_folder, tmp_path):
    out = write(text_folder, tmp_path / "shards", Counting())
    with pytest.raises(ValueError, match="data.path must be a text or JSON-lines corpus to "):
        write(out, tmp_path / "again", Counting())


def test_empty_corpus_writes_nothing(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="must hold at least one document, got none"):
        write(tmp_path / "empty", tmp_path / "shards", Counting())
    assert not (tmp_path / "shards").exists()


def run_launcher(*args):
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, str(ROOT / "launch" / "tokenize.py"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_launcher_writes_shards(text_folder, tmp_path, texts):
    """launch/tokenize.py parses its flags and writes the folder (its one-line errors are
    cli.run's, tested with it)."""
    out = tmp_path / "s"
    done = run_launcher(f"--data_path={text_folder}", f"--out={out}", "--shard_documents=16")
    assert done.returncode == 0, done.stderr
    total = sum(len(t.encode()) for t in texts)
    assert total == 5928
    assert done.stdout.splitlines() == [
        f"{out}: {total} tokens of 41 documents in 3 shard(s), tokenizer bytes (vocabulary 256)"
    ]
    assert "tokenizing: 100%" in done.stderr and "41/41" in done.stderr  # the progress bar


def test_split_streams_on_disk_equal_those_in_memory(text_folder, tmp_path):
    """From shards the streams are built once beside them and memory-mapped; a small
    corpus in memory gives the same arrays."""
    out = write(text_folder, tmp_path / "shards", Counting())
    mapped = data.load(lm_corpus.config(out, heldout_fraction=0.2), seed=0)
    folder = streams.split_folder(out, 0.2)
    assert sorted(p.name for p in folder.iterdir()) == ["heldout.npy", "split.json", "train.npy"]
    assert isinstance(mapped.train_stream, np.memmap)
    split = streams.in_memory(shards.read(out)[1], 0.2, eos_id=0)
    memory = data.TextData(split, tokenizer.ByteTokenizer(), seed=0)
    assert not isinstance(memory.train_stream, np.memmap)
    np.testing.assert_array_equal(mapped.train_stream, memory.train_stream)
    np.testing.assert_array_equal(mapped.heldout_stream, memory.heldout_stream)
    assert mapped.num_heldout_documents == memory.num_heldout_documents == 10
    assert mapped.bytes_per_token == memory.bytes_per_token == 1.0
    beside = data.load(lm_corpus.config(text_folder, heldout_fraction=0.2), seed=0)
    assert len(list(text_folder.parent.glob("corpus.tokens-*/split-0.2/train.npy"))) == 1
    np.testing.assert_array_equal(beside.heldout_stream, memory.heldout_stream)
    np.testing.assert_array_equal(mapped.train_batch(4, 6, 16), memory.train_batch(4, 6, 16))


def test_a_second_process_waits_for_the_folder(tmp_path):
    """`exclusive` blocks while another holder has the folder (processes of one run)."""
    order = []
    with shards.exclusive(tmp_path / "f"):
        waiter = threading.Thread(
            target=lambda: (shards.exclusive(tmp_path / "f").__enter__(), order.append("b"))
        )
        waiter.start()
        waiter.join(0.3)
        order.append("a")
    waiter.join(5)
    assert order == ["a", "b"]
