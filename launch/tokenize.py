"""Tokenize a corpus once into token shards that training reads (`data.path` = --out):

  python launch/tokenize.py --data_path=corpus.jsonl --tokenizer=tokenizer.json --out=shards

A killed run (even kill -9) resumes when rerun: finished shards are kept and skipped.
An --out made from another tokenizer or corpus is refused.
"""

import os
import sys

# This file shares its name with the standard library's `tokenize`, which absl's imports
# need: run as a script, its folder must not shadow it on the import path.
if sys.path and os.path.realpath(sys.path[0]) == os.path.dirname(os.path.realpath(__file__)):
    del sys.path[0]

from absl import flags  # noqa: E402

from beyondpar.base import cli  # noqa: E402
from beyondpar.lm import shards  # noqa: E402

DATA_PATH = flags.DEFINE_string(
    "data_path", "", "Corpus: folder of text files, .jsonl or .txt ('' = the default corpus)."
)
FORMAT = flags.DEFINE_enum("format", "auto", ["auto", "text", "jsonl"], "Corpus format.")
TEXT_FIELD = flags.DEFINE_string("text_field", "text", "The document's field in JSON lines.")
TOKENIZER = flags.DEFINE_string("tokenizer", "bytes", "'bytes', a tokenizer.json or a .gguf file.")
OUT = flags.DEFINE_string("out", None, "Shard folder (created; resumed if present).")
SHARD_DOCUMENTS = flags.DEFINE_integer(
    "shard_documents", shards.SHARD_DOCUMENTS, "Documents per shard."
)
flags.mark_flags_as_required(["out"])


def main(argv):
    del argv
    print(
        shards.tokenize_corpus(
            DATA_PATH.value,
            TOKENIZER.value,
            OUT.value,
            FORMAT.value,
            TEXT_FIELD.value,
            SHARD_DOCUMENTS.value,
        )
    )


if __name__ == "__main__":
    cli.run(main)
