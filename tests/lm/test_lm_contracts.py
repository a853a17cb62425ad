"""What the language-model data modules document and the other tests leave open: blank
lines with spaces, hidden folders and path order of a corpus folder, the default corpus as
an exact prefix of the library, the fingerprint's text field, named tokenizers' added
tokens, EOS fallback and bare encoding, atomic shard files, evenly spread held-out
windows, and the launcher's --text_field."""

import subprocess
import sys

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from beyondpar.lm import corpus, data, shards, tokenizer
from helpers import lm_corpus
from helpers.paths import ROOT


def texts_of(path, fmt="auto", field="text"):
    return [d.text for d in corpus.documents(str(path), fmt, field)]


def test_whitespace_only_lines_separate_documents(tmp_path):
    single = tmp_path / "c.txt"
    single.write_text("one\n \t \ntwo\n\nthree\n  \nfour")
    assert texts_of(single) == ["one", "two", "three", "four"]


def test_folder_skips_hidden_folders_and_reads_by_relative_path(tmp_path):
    folder = tmp_path / "corpus"
    for name, text in [
        ("c.txt", "c"),
        ("b/a.txt", "b/a"),
        ("a/z.txt", "a/z"),
        (".git/HEAD", "hidden folder"),
        ("a/.cache/x.txt", "nested hidden folder"),
    ]:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    assert texts_of(folder) == ["a/z", "b/a", "c"]
    assert corpus.count_hint(str(folder), "auto") == 3


def test_count_hint_counts_documents_not_empty_files(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a.txt").write_text("a")
    (folder / "b.txt").write_text("")
    assert corpus.count_hint(str(folder), "auto") == len(texts_of(folder)) == 1


def test_default_corpus_files_are_a_prefix_within_the_cap():
    """Files are taken in path order until the next one would pass the cap: a prefix of
    the library's files, never a later small file after a large one is left out."""
    docs = list(corpus.default_documents())
    topics = [d for d in docs if d.source.startswith("pydoc_data/topics.py:")]
    taken = [d.source for d in docs[len(topics) :]]
    root = corpus.stdlib_root()
    every = [str(p.relative_to(root)) for p in corpus.default_files()]
    assert taken == every[: len(taken)] and len(taken) < len(every)
    used = sum(len(d.text.encode()) for d in docs)
    following = len((root / every[len(taken)]).read_bytes())
    assert used <= corpus.DEFAULT_CAP_BYTES < used + following
    if sys.version_info[:3] == (3, 11, 7):  # the numbers corpus.py states
        assert (used, len(docs), len(topics)) == (4_131_836, 295, 79)
        assert (taken[0], taken[-1]) == ("__future__.py", "http/client.py")


def test_fingerprint_changes_with_the_text_field(tmp_path):
    jsonl = lm_corpus.write_jsonl(tmp_path / "c.jsonl", ["one", "two"], field="text")
    assert corpus.fingerprint(str(jsonl), "auto", "text") != corpus.fingerprint(
        str(jsonl), "auto", "body"
    )


def word_tokenizer(path, specials, template=None):
    """A word-level tokenizer.json of vocabulary {[UNK], a, b} plus `specials` (ids 3, 4,
    ...), optionally with a post-processor template that adds special tokens."""
    vocab = {"[UNK]": 0, "a": 1, "b": 2}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(list(specials))
    if template:
        ids = [(s, tok.token_to_id(s)) for s in specials]
        tok.post_processor = processors.TemplateProcessing(single=template, special_tokens=ids)
    tok.save(str(path))
    return tokenizer.load(str(path))


def test_vocab_size_counts_every_added_token(tmp_path):
    tok = word_tokenizer(tmp_path / "tokenizer.json", ["<|endoftext|>", "<pad>"])
    assert (tok.eos_id, tok.vocab_size) == (3, 5)
    ids = tok.encode_batch(["a <pad> b"])[0]
    assert ids.tolist() == [1, 4, 2] and ids.max() < tok.vocab_size


def test_eos_falls_back_to_the_first_special_token(tmp_path):
    tok = word_tokenizer(tmp_path / "tokenizer.json", ["<s0>", "<s1>"])
    assert tok.eos_id == 3


def test_named_tokenizer_adds_no_special_tokens(tmp_path):
    tok = word_tokenizer(
        tmp_path / "tokenizer.json", ["<|endoftext|>"], template="$A <|endoftext|>"
    )
    assert [i.tolist() for i in tok.encode_batch(["a b", "b"])] == [[1, 2], [2]]
    assert tok.encode("a b").tolist() == [1, 2]
    docs = [corpus.Document("x", "a b"), corpus.Document("y", "b")]
    assert shards.tokenize(docs, tok).lengths.tolist() == [2, 1]


def test_a_killed_shard_write_leaves_no_shard_file(text_folder, tmp_path, monkeypatch):
    """Each shard file is written atomically: a write killed part way leaves no file
    under the shard's name, and the rerun still finishes the folder."""
    out = tmp_path / "shards"
    save = np.save

    def killed(file, array):
        save(file, array[: len(array) // 2])
        raise KeyboardInterrupt

    monkeypatch.setattr(np, "save", killed)
    with pytest.raises(KeyboardInterrupt):
        shards.write(str(text_folder), "auto", "text", tokenizer.ByteTokenizer(), out, 8, False)
    assert not list(out.glob("shard_*"))
    monkeypatch.setattr(np, "save", save)
    shards.write(str(text_folder), "auto", "text", tokenizer.ByteTokenizer(), out, 8, False)
    assert shards.read_index(out)["complete"]


def test_heldout_windows_are_spread_evenly(text_folder, tmp_path):
    loaded = data.load(lm_corpus.config(text_folder), seed=3, cache_dir=tmp_path / "work")
    available = loaded.num_heldout_windows(16)
    held = np.asarray(loaded.heldout_stream, np.int32)
    windows = loaded.heldout_windows(3, 16)
    for row, k in zip(windows, [0, available // 3, 2 * available // 3], strict=True):
        np.testing.assert_array_equal(row, held[k * 16 : k * 16 + 17])
    last = loaded.heldout_windows(available, 16)[-1]
    np.testing.assert_array_equal(last, held[(available - 1) * 16 : available * 16 + 1])


def test_launcher_reads_the_text_field(tmp_path):
    texts = ["first document", "second, naïve"]
    jsonl = lm_corpus.write_jsonl(tmp_path / "c.jsonl", texts, field="body")
    out = tmp_path / "s"
    done = subprocess.run(
        [sys.executable, str(ROOT / "launch" / "tokenize_corpus.py")]
        + [f"--data_path={jsonl}", "--text_field=body", f"--out={out}"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    total = sum(len(t.encode()) for t in texts)
    assert done.stdout.startswith(f"{out}: {total} tokens of 2 documents in 1 shard(s)")
    assert shards.read_index(out)["text_field"] == "body"
