"""What the benchmarks feed the code they time, and the figures they derive from the
times: the random GGUF file's types and weights, the random corpus windows, the best and
worst of interleaved loads, and the fidelity kernel's cost per matrix."""

from __future__ import annotations

from types import SimpleNamespace

import gguf
import numpy as np
import pytest

from beyondpar.benchmarks import corpus, gguf_models, load
from beyondpar.benchmarks import pretrained as pretrained_benchmark

# Rows of 256 and 512 values: every matrix takes a K-quant type, none falls back.
WIDE_QWEN2 = dict(
    vocab_size=300,
    hidden_size=256,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=512,
    max_position_embeddings=64,
    rope_theta=1e4,
    rms_norm_eps=1e-5,
)


def test_qwen2_file_has_the_q4_k_m_mix_and_unit_scale_norms(tmp_path):
    """On 8 layers llama.cpp widens attn_v and ffn_down on layers 0, 3, 6 and 7 (the first
    eighth, the last eighth, every third in between): 8 of them plus the output head are
    Q6_K; the embedding and the other 48 matrices Q4_K; 5 vectors a layer and the final
    norm F32. RMS norm weights are stored as 1 plus small noise, as trained ones are near
    one: weights near zero would make the timed model's activations vanish."""
    path = tmp_path / "wide.gguf"
    counts = gguf_models.write_qwen2_gguf(path, WIDE_QWEN2, seed=3)
    assert counts == {"Q4_K": 49, "Q6_K": 9, "F32": 41}
    reader = gguf.GGUFReader(path)
    types = {t.name: gguf.GGMLQuantizationType(t.tensor_type).name for t in reader.tensors}
    wide = {n for n, q in types.items() if q == "Q6_K"}
    want = {f"blk.{i}.{p}.weight" for i in (0, 3, 6, 7) for p in ("attn_v", "ffn_down")}
    assert wide == want | {"output.weight"}
    norms = [t for t in reader.tensors if t.name.endswith("norm.weight")]
    assert len(norms) == 2 * 8 + 1
    values = np.concatenate([np.asarray(t.data, np.float64).ravel() for t in norms])
    assert values.size == 17 * 256
    assert values.mean() == pytest.approx(1.0, abs=0.01)
    assert values.std() == pytest.approx(0.05, rel=0.1)


def test_random_windows_are_grouped_four_to_a_document():
    """Ten windows make three documents (4 + 4 + 2), counted by rounding up; token ids of
    the requested shape and type, inside the vocabulary, fixed by the seed."""
    w = corpus.random_windows(10, 7, 50, seed=5)
    assert w.tokens.shape == (10, 7) and w.tokens.dtype == np.int32
    assert w.tokens.min() >= 0 and w.tokens.max() < 50
    np.testing.assert_array_equal(w.document, [0, 0, 0, 0, 1, 1, 1, 1, 2, 2])
    assert w.num_documents == w.documents_used == 3 == w.document.max() + 1
    assert w.total_windows == 10 and w.dropped_tail_tokens == 0
    np.testing.assert_array_equal(w.tokens, corpus.random_windows(10, 7, 50, seed=5).tokens)
    assert corpus.random_windows(8, 3, 50).num_documents == 2


def _fake_load(script):
    """A stand-in for one load in a fresh process, answering from `script` in turn."""
    calls = []

    def one_load(path, which):
        calls.append(which)
        return script[which][sum(c == which for c in calls) - 1]

    return one_load, calls


def test_compare_takes_each_paths_best_time_and_worst_peak(monkeypatch):
    """Loads alternate previous/new; each path's time is its fastest run, its memory its
    largest peak, and the speedup the ratio of the two best times."""
    run = lambda s, peak, before=0.3, sums=None: {  # noqa: E731
        "seconds": s,
        "peak_rss_gb": peak,
        "rss_before_load_gb": before,
        "weights_gb": 0.125,
        "checksum": sums or {"a": 1.0},
    }
    script = {
        "previous": [run(4.0, 2.0), run(3.0, 2.5), run(3.5, 1.5)],
        "new": [run(1.5, 0.7, 0.4), run(1.0, 0.9), run(1.2, 0.8)],
    }
    one_load, calls = _fake_load(script)
    monkeypatch.setattr(load, "one_load", one_load)
    r = load.compare("file.gguf", 3)
    assert calls == ["previous", "new"] * 3
    assert (r["seconds"], r["previous_seconds"]) == (1.0, 3.0)
    assert r["speedup"] == pytest.approx(3.0)
    assert (r["peak_rss_gb"], r["previous_peak_rss_gb"]) == (0.9, 2.5)
    assert r["rss_before_load_gb"] == 0.4 and r["weights_gb"] == 0.125
    assert r["all_seconds"] == [1.5, 1.0, 1.2]
    assert r["all_previous_seconds"] == [4.0, 3.0, 3.5]
    assert r["same_values"] is True

    script["new"][2] = run(1.2, 0.8, sums={"a": 1.5})
    one_load, calls = _fake_load(script)
    monkeypatch.setattr(load, "one_load", one_load)
    assert load.compare("file.gguf", 3)["same_values"] is False


def test_fidelity_kernel_cost_is_per_attention_matrix(monkeypatch):
    """The kernel runs on one layer's H x T x T stack, so its time per matrix divides by
    H heads (3 here, against T = 8 tokens); the paper's method is timed on one matrix;
    pairwise synergy of one layer scales to all layers."""
    stack = np.full((3, 8, 8), 1 / 8)  # one layer: 3 heads over 8 tokens
    monkeypatch.setattr(
        pretrained_benchmark.pretrained, "layer_by_layer", lambda m, p, t: iter([(0, [stack])])
    )
    module = SimpleNamespace(config=SimpleNamespace(num_layers=2))
    times = iter([0.6, 0.3, 0.9, 0.25])  # kernel twice, the paper's once, pairwise once
    monkeypatch.setattr(pretrained_benchmark, "timed", lambda fn: (None, next(times)))
    r = pretrained_benchmark._kernel_against_paper(module, None, np.zeros((1, 8), int), repeats=1)
    assert r["fidelity_ms_per_matrix"] == pytest.approx(100.0)
    assert r["paper_fidelity_ms_per_matrix"] == pytest.approx(900.0)
    assert r["speedup_vs_paper_fidelity"] == pytest.approx(9.0)
    assert r["pairwise_synergy_s_per_layer"] == pytest.approx(0.25)
    assert r["pairwise_synergy_s_all_layers"] == pytest.approx(0.5)
