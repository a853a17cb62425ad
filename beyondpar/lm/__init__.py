"""Text for language-model training: a corpus (files, JSON lines, token shards or the
built-in default) -> tokens (bytes or a named tokenizer) -> a held-out split by document
-> packed windows in a batch order that is a function of (seed, step).

`data.load(config.data, seed, cache_dir)` -> `data.TextData`; `shards.write` tokenizes a
large corpus once (`launch/tokenize.py`).
"""

from beyondpar.lm import corpus, data, packing, shards, tokenizer  # noqa: F401
from beyondpar.lm.data import TextData, check_vocab, default_data_config, load  # noqa: F401
