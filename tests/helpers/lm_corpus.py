"""A small real-text corpus for the language-model data tests: the paragraphs of the
declaration in tests/data/text, then short documents in several scripts."""

import json
from pathlib import Path

from beyondpar.lm import data
from helpers.paths import DATA

EXTRA = [
    f"Document {i}: naïve café – 東京 {'αβγ ' * (i % 5)}line {i}\nsecond line {i * i}."
    for i in range(30)
]


def documents() -> list[str]:
    text = (DATA / "text" / "declaration.txt").read_text(encoding="utf-8")
    return [p for p in text.split("\n\n") if p.strip()] + EXTRA


def write_folder(folder: Path, texts: list[str]) -> Path:
    """One text file per document, named so that path order is list order."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, text in enumerate(texts):
        (folder / f"doc_{i:03d}.txt").write_text(text, encoding="utf-8")
    return folder


def write_jsonl(path: Path, texts: list[str], field: str = "body") -> Path:
    lines = [json.dumps({"id": i, field: t}) for i, t in enumerate(texts)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def config(path, **fields):
    """The data config of a corpus path, with `fields` changed."""
    cfg = data.default_data_config()
    cfg.path = str(path)
    cfg.update(fields)
    return cfg
