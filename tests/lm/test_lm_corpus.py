"""Corpora on disk: the formats read in a fixed order, the default corpus as its
docstring states it, and one clear error for each bad corpus."""

import json

import ml_collections
import pytest

from beyondpar.lm import corpus, data, shards
from helpers import lm_corpus


def texts_of(path, fmt="auto", field="text"):
    return [d.text for d in corpus.documents(str(path), fmt, field)]


def test_formats_give_the_documents_in_order(tmp_path, text_folder, texts):
    assert texts_of(text_folder) == texts
    jsonl = lm_corpus.write_jsonl(tmp_path / "c.jsonl", texts)
    assert texts_of(jsonl, field="body") == texts
    single = tmp_path / "c.txt"
    single.write_text("first paragraph\nstill first\n\n  \n\nsecond\n\n\nthird")
    assert texts_of(single) == ["first paragraph\nstill first", "second", "\nthird"]
    nested = tmp_path / "nested"
    (nested / "b").mkdir(parents=True)
    (nested / "b" / "x.md").write_text("in b")
    (nested / "a.txt").write_text("top")
    (nested / ".hidden").write_text("skipped")
    lm_corpus.write_jsonl(nested / "b" / "y.jsonl", ["line one", "line two"], field="text")
    assert texts_of(nested) == ["top", "in b", "line one", "line two"]
    assert corpus.resolve_format(str(jsonl), "auto") == "jsonl"
    assert corpus.resolve_format(str(text_folder), "auto") == "text"
    assert corpus.count_hint(str(text_folder), "auto") == 41
    assert corpus.count_hint(str(nested), "auto") is corpus.count_hint(str(jsonl), "auto") is None


def test_default_corpus_is_as_documented():
    docs = list(corpus.default_documents())
    sizes = [len(d.text.encode()) for d in docs]
    topics = [d for d in docs if d.source.startswith("pydoc_data/topics.py:")]
    assert 1_000_000 < sum(sizes) <= corpus.DEFAULT_CAP_BYTES == 4_194_304
    assert len(topics) > 50 and docs[0].source == "pydoc_data/topics.py:assert"
    files = [d.source for d in docs[len(topics) :]]
    assert files == sorted(files, key=lambda s: s.split("/"))
    assert not [f for f in files if {"test", "tests", "encodings"} & set(f.split("/"))]
    assert topics[0].text.startswith('The "assert" statement\n')


def test_fingerprint_changes_with_the_corpus(text_folder):
    before = corpus.fingerprint(str(text_folder), "auto", "text")
    assert before == corpus.fingerprint(str(text_folder), "auto", "text")
    (text_folder / "doc_005.txt").write_text("another text")
    assert corpus.fingerprint(str(text_folder), "auto", "text") != before


def bad_corpus(tmp_path, kind):
    """A corpus path of the given kind of badness."""
    folder = tmp_path / kind
    folder.mkdir()
    if kind == "latin1":
        (folder / "a.txt").write_bytes("naïve".encode("latin-1"))
    elif kind == "nul":
        (folder / "a.txt").write_bytes(b"abc\x00def")
    elif kind in ("bad_json", "no_field"):
        line = "{oops" if kind == "bad_json" else json.dumps({"body": "x"})
        (folder / "c.jsonl").write_text(f'{{"text": "fine"}}\n{line}\n')
        return folder / "c.jsonl"
    elif kind == "one_document":
        (folder / "a.txt").write_text("only one")
    return folder


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("empty", "must hold at least one document, got none \\(empty corpus\\)"),
        ("latin1", "a.txt must be UTF-8 text, got byte 0xef at offset 2"),
        ("nul", "a.txt must be text, got binary \\(it holds NUL bytes\\)"),
        ("bad_json", "c.jsonl:2 must be a JSON object, got invalid JSON"),
        (
            "no_field",
            "c.jsonl:2 must be an object with a string 'text' \\(data.text_field\\), got no 'text'",
        ),
        (
            "one_document",
            "data.path must hold at least 2 documents \\(one to train on, one held out\\), got 1",
        ),
    ],
)
def test_bad_corpus_is_one_clear_error(tmp_path, kind, message):
    path = bad_corpus(tmp_path, kind)
    for cache in (None, tmp_path / "work"):  # in memory and through shards
        with pytest.raises(ValueError, match=message):
            data.load(lm_corpus.config(path), seed=0, cache_dir=cache)
    # nothing half-written: no shard folder, or a whole one (a one-document corpus)
    indexes = list(tmp_path.glob("work/*/index.json"))
    assert [shards.files.read_json(i)["complete"] for i in indexes] == [True] * (
        kind == "one_document"
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"path": "/no/such/corpus"},
            "data.path must be a corpus file or folder, got '/no/such/corpus'",
        ),
        ({"format": "csv"}, "data.format"),
        ({"heldout_fraction": 0.0}, "data.heldout_fraction"),
        ({"text_field": ""}, "data.text_field must name the documents' field, got ''"),
        ({"heldout_fraction": 1.0}, "data.heldout_fraction"),
        (
            {"path": "", "format": "jsonl"},
            "data.format must be 'auto' or 'text' for the default corpus",
        ),
    ],
)
def test_bad_data_config(text_folder, fields, message):
    cfg = lm_corpus.config(text_folder)
    cfg.update(fields)
    with pytest.raises(ValueError, match=message):
        data.load(cfg, seed=0)


def test_config_fields_must_be_strings(text_folder):
    fields = {**lm_corpus.config(text_folder).to_dict(), "tokenizer": 7}
    with pytest.raises(ValueError, match="data.tokenizer must be a string, got 7"):
        data.load(ml_collections.ConfigDict(fields), seed=0)


def test_short_corpus_is_refused_at_the_first_batch(tmp_path):
    folder = lm_corpus.write_folder(tmp_path / "short", ["tiny one", "tiny two", "tiny three"])
    loaded = data.load(lm_corpus.config(folder), seed=0)
    assert loaded.train_tokens + loaded.heldout_tokens == 8 + 8 + 10 + 3
    with pytest.raises(
        ValueError, match="seq_len must leave at least one window .* got seq_len=64"
    ):
        loaded.train_batch(0, 2, 64)
    with pytest.raises(ValueError, match="count must be at most the 0 held-out windows"):
        loaded.heldout_windows(1, 64)
