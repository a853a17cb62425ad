"""The tokenizer stored in a GGUF file, rebuilt with `tokenizers` so that it gives the ids
llama.cpp gives (its `src/llama-vocab.cpp`), on any text.

- `tokenizer.ggml.model` "gpt2", byte-level BPE: the stored merges, after llama.cpp's
  pre-tokenizer of the family (`tokenizer.ggml.pre`): its regexes applied one after the
  other, each splitting the pieces of the one before and keeping the text between matches
  as pieces of its own; no Unicode normalisation; whole words that are tokens kept whole
  where llama.cpp ignores merges (Llama 3).
- `tokenizer.ggml.model` "llama", SentencePiece (Llama 2, Mistral 7B v0.1, TinyLlama,
  Phi-3, Gemma): llama.cpp merges the two neighbouring symbols whose concatenation is the
  token of highest score, over the whole text, so the merges here are every split of every
  token into two tokens, ranked by the score of the token they make. Spaces become "▁",
  one is put before the text (and after every special token) unless
  `tokenizer.ggml.add_space_prefix` is false, and characters outside the vocabulary
  become their UTF-8 bytes as `<0xNN>` tokens.

Control and unknown-type tokens are special (kept whole, left out of `decode`), user-defined
ones are kept whole and decoded; BOS and EOS are added as the file says, with llama.cpp's
defaults where it says nothing (`encode(text, add_special_tokens=False)` leaves them out,
as llama.cpp's `add_special=false` does). Not applied: llama.cpp's exceptions by model
name (for Phi-3 it drops the whitespace after special tokens).
"""

from __future__ import annotations

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, processors
from tokenizers import pre_tokenizers as pre

from beyondpar.base import checks

# llama.cpp's regexes (src/llama-vocab.cpp); GPT-2's carries the final `|\s+` that
# llama.cpp's own matcher for it applies.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = _LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
_QWEN35 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Written as escapes: an editor's Unicode normalisation would change several of these.
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_DEEPSEEK_PUNCTUATION = "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+"
_DEEPSEEK_LETTERS = (
    "\\s?["
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
    "\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a"
    "\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-"
    "\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-"
    "\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-"
    "\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-"
    "\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-"
    "\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-"
    "\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-"
    "\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-"
    "\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-"
    "\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-"
    "\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
    "\U0001e900-\U0001e943]+"
)
_GPT2_STEPS = (_GPT2,)
_LLAMA3_STEPS = (_LLAMA3,)
_QWEN2_STEPS = (_QWEN2,)
_DIGIT_STEPS = (r"\p{N}", _GPT2)
# tokenizer.ggml.pre -> the regexes llama.cpp applies in turn (`\z`: end of the piece).
SPLITS = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"),
    "gpt-2": _GPT2_STEPS,
    "phi-2": _GPT2_STEPS,
    "mpt": _GPT2_STEPS,
    "olmo": _GPT2_STEPS,
    "starcoder": _DIGIT_STEPS,
    "refact": _DIGIT_STEPS,
    "command-r": _DIGIT_STEPS,
    "smollm": _DIGIT_STEPS,
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]"),
    "deepseek-llm": (
        "[\r\n]",
        _DEEPSEEK_LETTERS,
        _DEEPSEEK_PUNCTUATION,
        r"\s+\z",
        _CJK,
        r"\p{N}+",
    ),
    "deepseek-coder": ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"),
    "llama-bpe": _LLAMA3_STEPS,
    "llama3": _LLAMA3_STEPS,
    "llama-v3": _LLAMA3_STEPS,
    "falcon3": _LLAMA3_STEPS,
    "qwen2": _QWEN2_STEPS,
    "deepseek-r1-qwen": _QWEN2_STEPS,
    "stablelm2": _QWEN2_STEPS,
    "megrez": _QWEN2_STEPS,
    "qwen35": (_QWEN35,),
}
PRE_TOKENIZERS = tuple(SPLITS)
# Families where llama.cpp keeps a whole piece that is a token (ignore_merges) and adds
# BOS when the file does not say.
_WHOLE_WORDS = ("llama-bpe", "llama3", "llama-v3", "falcon3")
_CONTROL, _UNKNOWN, _USER_DEFINED = 3, 2, 4
_SPACE = "▁"


def build(source) -> Tokenizer:
    """A `tokenizers.Tokenizer` giving llama.cpp's ids for the tokenizer of a `GgufFile`."""
    kind = source.value("tokenizer.ggml.model")
    tokens = _tokens(source)
    if kind == "gpt2":
        style = _pre_tokenizer_name(source)
        tok = _byte_level_bpe(source, tokens, style)
        add_bos, default_ids = style in _WHOLE_WORDS, (11, 11)  # llama.cpp's BOS/EOS ids
    elif kind == "llama":
        tok = _sentencepiece(source, tokens)
        add_bos, default_ids = True, (1, 2)
    else:
        raise ValueError(
            f"GGUF file {source.path}: tokenizer.ggml.model must be 'gpt2' (byte-level BPE) "
            f"or 'llama' (SentencePiece), got {kind!r}"
        )
    _add_whole_tokens(tok, source, tokens)
    processor = _bos_eos(source, tokens, add_bos, default_ids)
    if processor is not None:
        tok.post_processor = processor
    return tok


def _tokens(source) -> list[str]:
    """The vocabulary, an empty entry named as llama.cpp names it."""
    tokens = list(source.value("tokenizer.ggml.tokens"))
    return [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]


def _pre_tokenizer_name(source) -> str:
    style = source.value("tokenizer.ggml.pre", "default")
    return checks.one_of(f"GGUF file {source.path}: tokenizer.ggml.pre", style, list(SPLITS))


def _split_merge(merge: str) -> tuple[str, str]:
    """llama.cpp's split of a stored merge: at the first space after the first byte."""
    cut = merge.find(" ", 1)
    if cut < 0:
        raise ValueError(f"tokenizer.ggml.merges entries must be 'left right', got {merge!r}")
    return merge[:cut], merge[cut + 1 :]


def _byte_level_bpe(source, tokens: list[str], style: str) -> Tokenizer:
    vocab = {token: i for i, token in enumerate(tokens)}
    merges = [_split_merge(m) for m in source.value("tokenizer.ggml.merges")]
    tok = Tokenizer(models.BPE(vocab, merges, ignore_merges=style in _WHOLE_WORDS))
    splits = [pre.Split(Regex(pattern), behavior="isolated") for pattern in SPLITS[style]]
    byte_level = pre.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.pre_tokenizer = pre.Sequence([*splits, byte_level])
    tok.decoder = decoders.ByteLevel()
    return tok


def merges_by_score(tokens: list[str], scores) -> list[tuple[str, str]]:
    """Every split of a token into two tokens, the split making the highest-scoring token
    first: a BPE with these merges applies llama.cpp's SentencePiece merge order."""
    ids = {token: i for i, token in enumerate(tokens)}
    found = []
    for token, score in zip(tokens, scores, strict=True):
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ids and right in ids:
                found.append((-score, ids[token], cut, left, right))
    found.sort(key=lambda merge: merge[:3])
    return [(left, right) for *_, left, right in found]


def _sentencepiece(source, tokens: list[str]) -> Tokenizer:
    scores = source.value("tokenizer.ggml.scores", None) or [0.0] * len(tokens)
    if len(scores) != len(tokens):
        raise ValueError(
            f"GGUF file {source.path}: tokenizer.ggml.scores must have one score per token "
            f"({len(tokens)}), got {len(scores)}"
        )
    vocab = {token: i for i, token in enumerate(tokens)}
    unk_id = source.value("tokenizer.ggml.unknown_token_id", 0)
    unk = tokens[unk_id] if 0 <= unk_id < len(tokens) else None
    model = models.BPE(vocab, merges_by_score(tokens, scores), unk_token=unk, byte_fallback=True)
    tok = Tokenizer(model)
    prefix = source.value("tokenizer.ggml.add_space_prefix", True)
    escape = [normalizers.Replace(" ", _SPACE)]
    prepend = [normalizers.Prepend(_SPACE)] if prefix else []
    tok.normalizer = normalizers.Sequence([*prepend, *escape])
    steps = [decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence([*steps, decoders.Strip(" ", 1, 0)] if prefix else steps)
    return tok


def _add_whole_tokens(tok: Tokenizer, source, tokens: list[str]) -> None:
    """Control, unknown and user-defined tokens are matched in the raw text first, as
    llama.cpp's special-token partition does; only the first two are special."""
    types = source.value("tokenizer.ggml.token_type", [1] * len(tokens))
    special, whole = [], []
    for token, kind in zip(tokens, types, strict=True):
        if kind in (_CONTROL, _UNKNOWN):
            special.append(AddedToken(token, special=True, normalized=False))
        elif kind == _USER_DEFINED:
            whole.append(AddedToken(token, special=False, normalized=False))
    tok.add_special_tokens(special)
    tok.add_tokens(whole)


def _special_id(source, key: str, default: int, count: int) -> int:
    token_id = source.value(f"tokenizer.ggml.{key}", default)
    if not 0 <= token_id < count:
        raise ValueError(
            f"GGUF file {source.path}: tokenizer.ggml.{key} must be a token id in "
            f"[0, {count}), got {token_id}"
        )
    return token_id


def _bos_eos(source, tokens: list[str], add_bos: bool, default_ids: tuple[int, int]):
    """BOS before and EOS after the text when the file asks (llama.cpp's defaults
    otherwise: BOS for SentencePiece and Llama 3, never EOS)."""
    count = len(tokens)
    before, after = [], []
    if source.value("tokenizer.ggml.add_bos_token", add_bos):
        before.append(_special_id(source, "bos_token_id", default_ids[0], count))
    if source.value("tokenizer.ggml.add_eos_token", False):
        after.append(_special_id(source, "eos_token_id", default_ids[1], count))
    if not before and not after:
        return None
    single = [tokens[i] for i in before] + ["$A"] + [tokens[i] for i in after]
    pair = single + [piece if piece != "$A" else "$B" for piece in single]
    special = sorted({(tokens[i], i) for i in before + after})
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=special)
