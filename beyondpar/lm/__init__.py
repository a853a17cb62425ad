"""Text for language-model training: a corpus (files, JSON lines, token shards or the
built-in default) -> tokens (bytes or a named tokenizer) -> a held-out split by document
-> packed windows in a batch order that is a function of (seed, step).

`beyondpar.lm.data.load(config.data, seed, cache_dir)` -> `TextData`;
`beyondpar.lm.shards.write` tokenizes a large corpus once (`launch/tokenize.py`). Nothing
is imported here, so that the tokenizing launcher does not load the training side.
"""
