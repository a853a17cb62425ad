"""Fixtures of the language-model data tests: a small real-text corpus on disk."""

import pytest

from helpers import lm_corpus


@pytest.fixture
def texts() -> list[str]:
    return lm_corpus.documents()


@pytest.fixture
def text_folder(tmp_path, texts):
    return lm_corpus.write_folder(tmp_path / "corpus", texts)
