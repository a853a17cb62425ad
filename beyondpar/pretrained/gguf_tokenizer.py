"""The tokenizer stored in a GGUF file, rebuilt with `tokenizers` so that it gives the
model's own token ids: byte-level BPE from the stored vocabulary and merges, with the
pre-tokenizer split of the family (`tokenizer.ggml.pre`)."""

from __future__ import annotations

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, processors
from tokenizers import pre_tokenizers as pre

# Pre-tokenizer split patterns of the byte-level BPE families (tokenizer.ggml.pre).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = _LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")
PRE_TOKENIZERS = ("default", "gpt-2", "smollm", "llama-bpe", "llama3", "qwen2")


_SPLITS = {"llama-bpe": _LLAMA3_SPLIT, "llama3": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT}


def build(source):
    """A `tokenizers.Tokenizer` equal to the model's own, from a `GgufFile`."""
    kind = source.value("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(
            f"GGUF file {source.path}: tokenizer.ggml.model must be 'gpt2' (byte-level BPE), "
            f"got {kind!r}"
        )
    style = source.value("tokenizer.ggml.pre", "default")
    if style not in PRE_TOKENIZERS:
        raise ValueError(
            f"GGUF file {source.path}: tokenizer.ggml.pre must be one of "
            f"{list(PRE_TOKENIZERS)}, got {style!r}"
        )
    tokens = source.value("tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in source.value("tokenizer.ggml.merges")]
    vocab = {token: i for i, token in enumerate(tokens)}
    llama3 = style in ("llama-bpe", "llama3")
    tok = Tokenizer(models.BPE(vocab, merges, ignore_merges=llama3))
    byte_level = pre.ByteLevel(add_prefix_space=False, use_regex=style not in _SPLITS)
    steps = [byte_level]
    if style in _SPLITS:
        steps.insert(0, pre.Split(Regex(_SPLITS[style]), behavior="isolated"))
    if style == "smollm":
        steps.insert(0, pre.Digits(individual_digits=True))
    tok.pre_tokenizer = pre.Sequence(steps)
    if style == "qwen2":
        tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    types = source.value("tokenizer.ggml.token_type", [1] * len(tokens))
    special = [
        AddedToken(t, special=True, normalized=False)
        for t, k in zip(tokens, types, strict=True)
        if k in (3, 4)  # control and user-defined tokens are never split
    ]
    tok.add_special_tokens(special)
    if source.value("tokenizer.ggml.add_bos_token", False):
        bos_id = source.value("tokenizer.ggml.bos_token_id")
        bos = tokens[bos_id]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
        )
    return tok
