"""The analysis of a text through a pretrained model and of attention from elsewhere."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from beyondpar import analysis, analysis_report, graphs, metrics, pretrained
from conftest import DATA

HF = DATA / "hf"
ROOT = Path(__file__).resolve().parents[1]
SHORT = "Multi-head attention lets every head of a layer read the earlier tokens"
SPEC = analysis.AnalysisSpec(horizon=40, max_steps=40)


def test_text_record_measures_the_models_own_attention():
    module, params, tokenizer = pretrained.load(HF / "gpt2-tiny")
    record = analysis.text_record(HF / "gpt2-tiny", SHORT, SPEC)
    ids = tokenizer.encode(SHORT).ids
    assert record["tokens"] == ids and record["seq_len"] == len(ids)
    assert "".join(record["token_labels"]) == SHORT
    _, attn = pretrained.apply_with_attention(module, params, np.asarray([ids]))
    attn = np.asarray(attn, np.float64)[0]  # L x H x T x T
    for layer in range(2):
        kernel = np.asarray(params[f"h_{layer}"]["c_proj"]["kernel"])
        weights = graphs.head_importance(kernel, 4)
        learned = graphs.combine_heads(attn[layer], weights)
        got = record["layers"][layer]
        np.testing.assert_allclose(
            got["mixes"]["learned"]["fidelity"][0], metrics.minimax_fidelity(learned, 40), rtol=1e-4
        )
        np.testing.assert_allclose(
            got["heads"]["fidelity"][0], metrics.minimax_fidelity(attn[layer], 40), rtol=1e-4
        )
        np.testing.assert_allclose(
            got["heads"]["hitting_time_reference"][0],
            metrics.hitting_time(attn[layer], 40, "reference"),
            rtol=1e-4,
        )
        np.testing.assert_allclose(
            got["heads"]["tv_mixing_time_normalized"][0],
            metrics.tv_mixing_time(attn[layer], 0.25, 40, "normalized"),
        )
        assert got["best_head"][0] == int(np.argmax(metrics.minimax_fidelity(attn[layer], 40)))
    all_weights = np.stack(
        [
            graphs.head_importance(np.asarray(params[f"h_{i}"]["c_proj"]["kernel"]), 4)
            for i in range(2)
        ]
    )
    sink = graphs.rollout_sink(attn, all_weights, 0.5)
    np.testing.assert_allclose(record["rollout"]["sink_share"][0], sink, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(record["rollout"]["network_fidelity"][0], np.min(sink), rtol=1e-4)
    assert set(record["timings_s"]) >= {"load", "forward", "per-head and mixed metrics", "rollout"}


def test_attention_from_elsewhere_and_the_report(tmp_path):
    attn = np.load(HF / "llama-tiny" / "expected.npz")["attention"]  # B x L x H x T x T
    path = tmp_path / "attn.npz"
    np.savez(path, attention=attn)
    record = analysis.attention_record(
        path, analysis.AnalysisSpec(horizon=30, max_steps=30, layers=(1,))
    )
    assert list(record["layers"]) == [1] and record["num_sequences"] == 2
    uniform = graphs.combine_heads(attn[:, 1].astype(np.float64))
    np.testing.assert_allclose(
        record["layers"][1]["mixes"]["uniform"]["fidelity"],
        metrics.minimax_fidelity(uniform, 30),
        rtol=1e-4,
    )
    np.testing.assert_allclose(
        record["rollout"]["sink_share"],
        graphs.rollout_sink(attn.astype(np.float64)),
        rtol=1e-4,
        atol=1e-7,
    )
    written = analysis_report.write(record, tmp_path / "out")
    assert sorted(p.name for p in written) == [
        "analysis.json",
        "fidelity_heads.png",
        "pairwise_synergy.png",
        "report.md",
        "sink_share.png",
    ]
    saved = json.loads((tmp_path / "out" / "analysis.json").read_text())
    np.testing.assert_allclose(
        saved["layers"]["1"]["head_diversity"], record["layers"][1]["head_diversity"]
    )
    text = (tmp_path / "out" / "report.md").read_text()
    assert "| 1 | " in text and "Network fidelity" in text


@pytest.mark.parametrize(
    "attention,message",
    [
        (np.ones((2, 2, 4, 4)), "attention rows must sum to 1"),
        (
            np.ones((4, 4)) / 4,
            r"must have shape \(L, H, T, T\) or \(B, L, H, T, T\), got shape \(4, 4\)",
        ),
    ],
)
def test_bad_attention_files_are_named(tmp_path, attention, message):
    path = tmp_path / "bad.npz"
    np.savez(path, attention=attention)
    with pytest.raises(ValueError, match=f"attention file {path}: .*{message}"):
        analysis.attention_record(path, SPEC)
    np.savez(path, probs=attention)
    with pytest.raises(ValueError, match=r"must hold the key 'attention', got keys \['probs'\]"):
        analysis.attention_record(path, SPEC)


def test_empty_and_too_long_texts_and_bad_layers():
    with pytest.raises(ValueError, match="text must not be empty"):
        analysis.text_record(HF / "llama-tiny", "  ", SPEC)
    text = str(np.load(HF / "llama-tiny" / "expected.npz")["text"])
    with pytest.raises(ValueError, match="fit the model's context of 64 tokens, got 158 tokens"):
        analysis.text_record(HF / "llama-tiny", text, SPEC)
    with pytest.raises(ValueError, match=r"layers must be in \[0, 2\), got \[2\]"):
        analysis.text_record(HF / "llama-tiny", SHORT, analysis.AnalysisSpec(layers=(0, 2)))


def test_analyze_cli(tmp_path):
    def run(*flags):
        return subprocess.run(
            [sys.executable, str(ROOT / "launch" / "analyze.py"), *flags],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )

    done = run(
        f"--model={HF / 'llama3-rope'}",
        f"--text={SHORT}",
        f"--out={tmp_path}",
        "--layers=1",
        "--horizon=20",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "report.md").exists() and (tmp_path / "sink_share.png").exists()
    assert f"wrote {tmp_path / 'report.md'}" in done.stdout
    failed = run(f"--model={tmp_path / 'nothing'}", "--text=x", f"--out={tmp_path / 'x'}")
    assert failed.returncode == 2 and "must be a checkpoint folder or a model name" in failed.stderr
    assert not (tmp_path / "x").exists()
