"""GGUF tokenizers give llama.cpp's ids: a SentencePiece and a byte-level BPE vocabulary
(`data/gguf_tokenizer/`, written with gguf's GGUFWriter) against ids computed outside the
package (sentencepiece itself, and a port of llama.cpp's tokenizers with its regexes
applied by the `regex` package), on hard strings, for every pre-tokenizer."""

import itertools
import json

import gguf
import pytest

from beyondpar.pretrained.gguf import reader as gguf_reader
from beyondpar.pretrained.gguf import tokenizer as gguf_tokenizer
from helpers.paths import DATA

FIXTURES = DATA / "gguf_tokenizer"
SPM = FIXTURES / "spm.gguf"
BPE = FIXTURES / "bpe.gguf"
SPM_CASES = json.loads((FIXTURES / "spm.json").read_text(encoding="utf-8"))["cases"]
BPE_EXPECTED = json.loads((FIXTURES / "bpe.json").read_text(encoding="utf-8"))
# Names llama.cpp maps to the same pre-tokenizer as one the fixture was computed for.
SAME_AS = {
    "phi-2": "gpt-2",
    "olmo": "gpt-2",
    "llama-v3": "llama3",
    "falcon3": "llama3",
    "deepseek-r1-qwen": "qwen2",
    "stablelm2": "qwen2",
    "megrez": "qwen2",
}
PLAIN_BPE = [t for t in BPE_EXPECTED["texts"] if "<" not in t]


def with_metadata(path, tmp_path, **changes):
    """A copy of a vocabulary-only GGUF file with metadata changed (None removes a key;
    keys are given with '__' for '.', after 'tokenizer.ggml.')."""
    reader = gguf.GGUFReader(path)
    changes = {f"tokenizer.ggml.{k.replace('__', '.')}": v for k, v in changes.items()}
    arch = reader.fields["general.architecture"].contents()
    out = tmp_path / f"changed-{len(list(tmp_path.iterdir()))}.gguf"
    writer = gguf.GGUFWriter(out, arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = changes.pop(key, field.contents())
        if value is not None:
            sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(key, value, field.types[0], sub_type=sub)
    for key, value in changes.items():
        kind = gguf.GGUFValueType.BOOL if isinstance(value, bool) else gguf.GGUFValueType.UINT32
        kind = gguf.GGUFValueType.STRING if isinstance(value, str) else kind
        writer.add_key_value(key, value, kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def tokenizer(path):
    return gguf_reader.GgufFile(path).tokenizer()


def ids(tok, text, special=False):
    return tok.encode(text, add_special_tokens=special).ids


@pytest.fixture(scope="module")
def spm():
    return tokenizer(SPM)


@pytest.fixture(scope="module")
def bpe():
    return tokenizer(BPE)


# ------------------------------------------------------------------ SentencePiece


@pytest.mark.parametrize("case", SPM_CASES, ids=lambda case: repr(case["text"])[:30])
def test_sentencepiece_gives_llama_cpp_ids_on_hard_strings(spm, case):
    assert ids(spm, case["text"]) == case["ids"]


def test_the_hard_strings_include_what_sentencepiece_itself_tokenized():
    assert sum(case["sentencepiece"] for case in SPM_CASES) >= 25


def test_characters_outside_the_vocabulary_become_their_utf8_bytes(spm):
    assert spm.encode("😀", add_special_tokens=False).tokens == [
        "▁",
        "<0xF0>",
        "<0x9F>",
        "<0x98>",
        "<0x80>",
    ]
    for text in ("中文字符测试", "emoji😀inside", "\u00a0\u3000"):
        tokens = spm.encode(text, add_special_tokens=False).tokens
        assert any(t.startswith("<0x") for t in tokens)
        assert spm.decode(ids(spm, text)) == text


def test_a_space_is_put_before_the_text_and_after_special_tokens(spm):
    first = spm.encode("Hello world", add_special_tokens=False).tokens
    assert first[0].startswith("▁")
    after = spm.encode("a<tool>b", add_special_tokens=False).tokens
    assert after[after.index("<tool>") + 1].startswith("▁")


def test_add_space_prefix_false_puts_no_space_before_the_text(tmp_path, spm):
    plain = tokenizer(with_metadata(SPM, tmp_path, add_space_prefix=False))
    assert not plain.encode("Hello", add_special_tokens=False).tokens[0].startswith("▁")
    assert ids(plain, " Hello world") == ids(spm, "Hello world")
    assert ids(plain, "") == []
    assert plain.decode(ids(plain, "Hello world")) == "Hello world"
    unsaid = tokenizer(with_metadata(SPM, tmp_path, add_space_prefix=None))
    assert ids(unsaid, "Hello world") == ids(spm, "Hello world")  # llama.cpp's default


def test_add_space_prefix_false_decodes_a_leading_space_back(tmp_path, spm):
    """Without the space prefix nothing was put before the text, so decoding takes
    nothing off: a text that begins with spaces decodes to itself, spaces and all,
    while with the prefix the one space put in front is taken off again."""
    plain = tokenizer(with_metadata(SPM, tmp_path, add_space_prefix=False))
    for text in (" Hello world", "  Hello", " a b"):
        assert plain.decode(ids(plain, text)) == text
    assert spm.decode(ids(spm, " Hello world")) == " Hello world"
    assert spm.decode(ids(spm, "Hello")) == "Hello"


def test_control_and_user_defined_tokens_stay_whole(spm):
    control, user = spm.token_to_id("<|end|>"), spm.token_to_id("<tool>")
    assert ids(spm, "x<|end|>y").count(control) == 1
    assert ids(spm, "call <tool> now").count(user) == 1
    assert spm.decode(ids(spm, "a<tool>b")) == "a<tool> b"  # llama.cpp's space after it
    assert "<|end|>" not in spm.decode(ids(spm, "x<|end|>y"))


@pytest.mark.parametrize("case", SPM_CASES, ids=lambda case: repr(case["text"])[:30])
def test_sentencepiece_decoding_round_trips(spm, case):
    if "<" not in case["text"]:
        assert spm.decode(ids(spm, case["text"], special=True)) == case["text"]


def test_merges_follow_the_scores_of_the_tokens_they_make():
    tokens = ["a", "b", "c", "ab", "bc", "abc"]
    scores = [0.0, 0.0, 0.0, -2.0, -1.0, -3.0]
    assert gguf_tokenizer.merges_by_score(tokens, scores) == [
        ("b", "c"),
        ("a", "b"),
        ("a", "bc"),
        ("ab", "c"),
    ]


# ------------------------------------------------------------------ BOS and EOS


def test_sentencepiece_adds_bos_as_the_file_says(tmp_path, spm):
    assert ids(spm, "Hello", special=True) == [1, *ids(spm, "Hello")]
    assert ids(spm, "", special=True) == [1]
    off = tokenizer(with_metadata(SPM, tmp_path, add_bos_token=False))
    assert ids(off, "Hello", special=True) == ids(spm, "Hello")
    unsaid = tokenizer(with_metadata(SPM, tmp_path, add_bos_token=None, bos_token_id=None))
    assert ids(unsaid, "Hello", special=True)[0] == 1  # llama.cpp's default for SentencePiece
    moved = tokenizer(with_metadata(SPM, tmp_path, bos_token_id=2))
    assert ids(moved, "Hello", special=True)[0] == 2


def test_eos_is_added_when_the_file_asks(tmp_path, spm):
    both = tokenizer(with_metadata(SPM, tmp_path, add_eos_token=True))
    assert ids(both, "Hello", special=True) == [1, *ids(spm, "Hello"), 2]
    assert ids(both, "", special=True) == [1, 2]


def test_eos_takes_llama_cpp_default_id_when_the_file_names_none(tmp_path, spm):
    unnamed = tokenizer(with_metadata(SPM, tmp_path, add_eos_token=True, eos_token_id=None))
    assert ids(unnamed, "Hello", special=True) == [1, *ids(spm, "Hello"), 2]
    assert ids(unnamed, "", special=True) == [1, 2]


def test_a_pair_of_texts_gets_bos_and_eos_around_each(tmp_path, spm):
    both = tokenizer(with_metadata(SPM, tmp_path, add_eos_token=True))
    hello, world = ids(spm, "Hello"), ids(spm, "world")
    assert both.encode("Hello", "world").ids == [1, *hello, 2, 1, *world, 2]
    assert spm.encode("Hello", "world").ids == [1, *hello, 1, *world]


@pytest.mark.parametrize("pre,bos", [("gpt-2", False), ("qwen2", False), ("llama-bpe", True)])
def test_byte_level_bpe_adds_bos_by_llama_cpp_defaults(tmp_path, pre, bos):
    tok = tokenizer(with_metadata(BPE, tmp_path, pre=pre))
    assert (ids(tok, "Hello", special=True)[0] == 0) == bos
    said = tokenizer(with_metadata(BPE, tmp_path, pre=pre, add_bos_token=not bos))
    assert (ids(said, "Hello", special=True)[0] == 0) != bos


# ------------------------------------------------------------------ byte-level BPE


@pytest.mark.parametrize("pre", gguf_tokenizer.PRE_TOKENIZERS)
def test_every_pre_tokenizer_gives_llama_cpp_ids_on_hard_strings(tmp_path, pre):
    tok = tokenizer(with_metadata(BPE, tmp_path, pre=pre))
    want = BPE_EXPECTED["ids"][SAME_AS.get(pre, pre)]
    got = [ids(tok, text) for text in BPE_EXPECTED["texts"]]
    wrong = [(t, w, g) for t, w, g in zip(BPE_EXPECTED["texts"], want, got, strict=True) if w != g]
    assert not wrong, wrong[:3]
    assert all(tok.decode(ids(tok, t)) == t for t in PLAIN_BPE)


def test_the_pre_tokenizers_differ_on_the_fixture():
    """Each family's ids differ from every other's, so a wrong regex or step shows."""
    expected = BPE_EXPECTED["ids"]
    families = {json.dumps(v) for k, v in expected.items()}
    assert len(families) == 9  # gpt-2 = mpt, starcoder = refact = command-r = smollm


def test_a_missing_pre_tokenizer_is_llama_cpp_default(tmp_path):
    tok = tokenizer(with_metadata(BPE, tmp_path, pre=None))
    assert [ids(tok, t) for t in BPE_EXPECTED["texts"]] == BPE_EXPECTED["ids"]["default"]


def test_digits_are_split_as_each_family_splits_them(tmp_path):
    def pieces(pre, text):
        tok = tokenizer(with_metadata(BPE, tmp_path, pre=pre))
        return [tok.decode([i]) for i in ids(tok, text)]

    def cuts(pre, text):
        return set(itertools.accumulate(len(p) for p in pieces(pre, text)))

    assert pieces("qwen2", "12345") == ["1", "2", "3", "4", "5"]
    assert pieces("deepseek-coder", "2024") == ["2", "0", "2", "4"]
    assert {3, 6} <= cuts("llama3", "1234567")  # \p{N}{1,3}: groups of three
    assert {3, 6} <= cuts("falcon", "1234567")  # [0-9]{3} after the GPT-2 split


def test_no_unicode_normalisation_before_splitting(tmp_path):
    """llama.cpp tokenizes the bytes it is given: a decomposed accent is not composed."""
    tok = tokenizer(with_metadata(BPE, tmp_path, pre="qwen2"))
    assert ids(tok, "cafe\u0301") != ids(tok, "caf\u00e9")
    assert tok.decode(ids(tok, "cafe\u0301")) == "cafe\u0301"


def test_llama3_keeps_a_whole_word_that_is_a_token(tmp_path):
    tok = tokenizer(with_metadata(BPE, tmp_path, pre="llama3"))
    whole = tok.token_to_id("Ġzyxw")
    assert ids(tok, " zyxw") == [whole]
    assert whole not in ids(tokenizer(with_metadata(BPE, tmp_path, pre="gpt-2")), " zyxw")


def test_bpe_special_and_user_defined_tokens_stay_whole(bpe):
    assert ids(bpe, "x<|endoftext|>y").count(bpe.token_to_id("<|endoftext|>")) == 1
    assert ids(bpe, "a<tool>b").count(bpe.token_to_id("<tool>")) == 1
    assert bpe.decode(ids(bpe, "a<tool>b")) == "a<tool>b"
    assert bpe.decode(ids(bpe, "x<|endoftext|>y")) == "xy"


# ------------------------------------------------------------------ refusals


@pytest.mark.parametrize(
    "path,change,message",
    [
        (BPE, {"model": "bert"}, r"tokenizer.ggml.model must be 'gpt2' .* or 'llama' .*got 'bert'"),
        (
            BPE,
            {"pre": "chatglm-bpe"},
            r"tokenizer.ggml.pre must be one of \['default', .*'qwen35'\], got 'chatglm-bpe'",
        ),
        (SPM, {"scores": [0.0, 1.0]}, "tokenizer.ggml.scores must have one score per token"),
        (SPM, {"bos_token_id": 10**6}, r"bos_token_id must be a token id in \[0, 640\), got"),
        # one past the last id (the vocabulary holds 640 tokens)
        (SPM, {"bos_token_id": 640}, r"bos_token_id must be a token id in \[0, 640\), got 640"),
        (
            SPM,
            {"add_eos_token": True, "eos_token_id": 640},
            r"eos_token_id must be a token id in \[0, 640\), got 640",
        ),
    ],
)
def test_unsupported_tokenizers_are_one_line_errors(tmp_path, path, change, message):
    with pytest.raises(ValueError, match=message) as err:
        tokenizer(with_metadata(path, tmp_path, **change))
    assert "\n" not in str(err.value)


def test_the_unknown_token_is_special_like_a_control_token(spm):
    """`<unk>` (token type 2) in the text is matched whole, as llama.cpp's special-token
    partition matches it, and left out of decode like a control token."""
    unk = spm.token_to_id("<unk>")
    assert unk == 0
    assert ids(spm, "x<unk>y").count(unk) == 1
    assert "<unk>" not in spm.decode(ids(spm, "x<unk>y"))


def test_a_merge_is_split_at_the_first_space_after_its_first_character():
    """llama.cpp cuts a stored merge at the first space after its first byte, so a left
    token that begins with (or is) a space keeps it."""
    assert gguf_tokenizer._split_merge("Ġ t") == ("Ġ", "t")
    assert gguf_tokenizer._split_merge("  x") == (" ", "x")
    assert gguf_tokenizer._split_merge(" a b") == (" a", "b")
    assert gguf_tokenizer._split_merge("ab cd") == ("ab", "cd")


def test_a_merge_whose_left_token_starts_with_a_space_loads(tmp_path):
    """A vocabulary with tokens that begin with a literal space, and a merge of them,
    builds a tokenizer holding that merge as (' a', 'b'); the rest still encodes."""
    reader = gguf.GGUFReader(BPE)
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    types = reader.fields["tokenizer.ggml.token_type"].contents()
    merges = reader.fields["tokenizer.ggml.merges"].contents()
    path = with_metadata(
        BPE,
        tmp_path,
        tokens=[*tokens, " a", " ab"],
        token_type=[*types, 1, 1],
        merges=[*merges, " a b"],
    )
    tok = tokenizer(path)
    assert json.loads(tok.to_str())["model"]["merges"][-1] == [" a", "b"]
    assert [ids(tok, t) for t in BPE_EXPECTED["texts"]] == BPE_EXPECTED["ids"]["gpt-2"]


def test_a_character_without_its_byte_tokens_becomes_the_unknown_token(tmp_path):
    """Where a character's UTF-8 bytes are not all tokens, it becomes the unknown token:
    the one `unknown_token_id` names, else id 0 (llama.cpp's default for SentencePiece)."""
    tokens = list(gguf.GGUFReader(SPM).fields["tokenizer.ggml.tokens"].contents())
    tokens[tokens.index("<0xF0>")] = "<0xF0>?"  # the first byte of every 4-byte character
    unsaid = tokenizer(with_metadata(SPM, tmp_path, tokens=tokens, unknown_token_id=None))
    a, b = unsaid.token_to_id("▁a"), unsaid.token_to_id("b")
    assert ids(unsaid, "a😀b") == [a, 0, b]
    assert unsaid.token_to_id("<unk>") == 0
    named = tokenizer(with_metadata(SPM, tmp_path, tokens=tokens, unknown_token_id=3))
    assert ids(named, "a😀b") == [a, 3, b]
    # A character whose bytes are all tokens still becomes them.
    assert unsaid.encode("xΩ", add_special_tokens=False).tokens == ["▁x", "<0xCE>", "<0xA9>"]


def test_an_empty_token_is_named_by_its_own_index(tmp_path):
    """llama.cpp names an empty vocabulary entry `[EMPTY_<index>]`."""
    tokens = list(gguf.GGUFReader(SPM).fields["tokenizer.ggml.tokens"].contents())
    tokens[635] = tokens[639] = ""
    tok = tokenizer(with_metadata(SPM, tmp_path, tokens=tokens))
    assert tok.id_to_token(635) == "[EMPTY_635]"
    assert tok.id_to_token(639) == "[EMPTY_639]"
    assert tok.token_to_id("[EMPTY_639]") == 639
