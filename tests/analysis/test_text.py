"""The analysis of a text through a pretrained model and of attention from elsewhere."""

import dataclasses
import functools
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from beyondpar import graphs, measure, metrics, pretrained
from beyondpar.analysis import series, text_report
from beyondpar.analysis import text as text_lib
from beyondpar.base import parallel
from helpers.launchers import launch_many
from helpers.paths import DATA

HF = DATA / "hf"
ROOT = Path(__file__).resolve().parents[2]
SHORT = "Multi-head attention lets every head of a layer read the earlier tokens"
# Pairwise synergy is left out: no test here reads it from a text's record (the attention
# file's record, with its own spec, does), and the command lines below measure the same.
SPEC = measure.MeasureSpec(horizon=40, max_steps=40, pairwise=False)


@functools.cache
def short_record(model: str) -> dict:
    """The record of SHORT through tests/data/hf/`model` with SPEC, made once and only
    read: several tests check other parts of the same analysis."""
    return text_lib.text_record(HF / model, SHORT, SPEC)


def test_text_record_measures_the_models_own_attention():
    module, params, tokenizer = pretrained.load(HF / "gpt2-tiny")
    record = short_record("gpt2-tiny")
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
        # The heads and their learned mix in one batch: one program for both, the heads'
        # walks measured on it too; on the host, so reading the values compiles nothing.
        both = np.concatenate([attn[layer], learned[None]])
        fidelity = np.asarray(metrics.minimax_fidelity(both, 40))
        np.testing.assert_allclose(got["mixes"]["learned"]["fidelity"][0], fidelity[4], rtol=1e-4)
        np.testing.assert_allclose(got["heads"]["fidelity"][0], fidelity[:4], rtol=1e-4)
        np.testing.assert_allclose(
            got["heads"]["hitting_time_reference"][0],
            np.asarray(metrics.hitting_time(both, 40, "reference"))[:4],
            rtol=1e-4,
        )
        np.testing.assert_allclose(
            got["heads"]["tv_mixing_time_normalized"][0],
            np.asarray(metrics.tv_mixing_time(both, 0.25, 40, "normalized"))[:4],
        )
        assert got["best_head"][0] == int(np.argmax(fidelity[:4]))
    all_weights = np.stack(
        [
            graphs.head_importance(np.asarray(params[f"h_{i}"]["c_proj"]["kernel"]), 4)
            for i in range(2)
        ]
    )
    sink = np.asarray(graphs.rollout_sink(attn, all_weights, 0.5))
    np.testing.assert_allclose(record["rollout"]["sink_share"][0], sink, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(record["rollout"]["network_fidelity"][0], np.min(sink), rtol=1e-4)
    assert set(record["timings_s"]) >= {"load", "forward", "per-head and mixed metrics", "rollout"}


def test_attention_from_elsewhere_and_the_report(tmp_path):
    # B x L x H x T x T; its first 24 tokens: causal, so their rows still sum to 1.
    attn = np.load(HF / "llama-tiny" / "expected.npz")["attention"][..., :24, :24]
    path = tmp_path / "attn.npz"
    np.savez(path, attention=attn)
    record = text_lib.attention_record(
        path, measure.MeasureSpec(horizon=30, max_steps=30, layers=(1,))
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
    written = text_report.write(record, tmp_path / "out")
    assert sorted(p.name for p in written) == [
        "analysis.json",
        "fidelity_heads.png",
        "index.html",
        "pairwise_synergy.png",
        "report.md",
        "sink_share.png",
    ]
    saved = json.loads((tmp_path / "out" / "analysis.json").read_text())
    np.testing.assert_allclose(
        saved["layers"]["1"]["head_diversity"], record["layers"][1]["head_diversity"]
    )
    text = (tmp_path / "out" / "report.md").read_text()
    assert "Network fidelity" in text
    assert "### Layer 2\n" in text and "### Layer 1\n" not in text  # key 1 is layer 2


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
        text_lib.attention_record(path, SPEC)
    np.savez(path, probs=attention)
    with pytest.raises(ValueError, match=r"must hold the key 'attention', got keys \['probs'\]"):
        text_lib.attention_record(path, SPEC)


def test_a_cut_short_attention_file_is_named(tmp_path):
    path = tmp_path / "cut.npz"
    np.savez(path, attention=np.ones((2, 2, 4, 4)) / 4)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ValueError, match=f"^attention file {path}: {path} is not a whole .npz"):
        text_lib.attention_record(path, SPEC)


def test_empty_and_too_long_texts_and_bad_layers():
    with pytest.raises(ValueError, match="text must not be empty"):
        text_lib.text_record(HF / "llama-tiny", "  ", SPEC)
    text = str(np.load(HF / "llama-tiny" / "expected.npz")["text"])
    with pytest.raises(ValueError, match="fit the model's context of 64 tokens, got 158 tokens"):
        text_lib.text_record(HF / "llama-tiny", text, SPEC)
    with pytest.raises(ValueError, match=r"layers must be in \[0, 2\), got \[2\]"):
        text_lib.text_record(HF / "llama-tiny", SHORT, measure.MeasureSpec(layers=(0, 2)))


def analyze_many(*command_lines):
    """Each list of flags as `launch/analyze.py` runs it, in order, from one interpreter."""
    return launch_many([("analyze.py", list(flags)) for flags in command_lines])


MESH_VALUES = ("data:2,model", "data:0,model:2", "tensor:2")
# SPEC as flags: the command lines measure what `short_record` measured.
SPEC_FLAGS = ["--horizon=40", "--max_steps=40", "--nopairwise"]
SERIES_SPEC = dataclasses.replace(SPEC, layers=(1,))  # series_flags'
OLD_NS = 10**18  # a date no analysis writes at
MESH_FLAGS = [f"--text={SHORT}", *SPEC_FLAGS, "--layers=1"]


def series_flags(folder: Path) -> list[str]:
    """The series command line over the two checkpoints under `folder`/ckpts, layer 1
    only (the layer the test reads)."""
    ckpts = folder / "ckpts" / "step*"
    return [f"--model={ckpts}", f"--text={SHORT}", f"--out={folder / 'series'}", "--layers=1"]


def analysed_series(folder: Path) -> None:
    """The series over `folder`/ckpts analysed in this process with SERIES_SPEC (the
    programs of `short_record("gpt2-tiny")`), its checkpoint reports dated OLD_NS and
    its summary removed: the command line must resume it and write the summary."""
    models = series.expand(str(folder / "ckpts" / "step*"))
    series.run(models, SHORT, SERIES_SPEC, folder / "series", progress=False)
    for report in (folder / "series").glob("step*/report.md"):
        os.utime(report, ns=(OLD_NS, OLD_NS))
    (folder / "series" / "series.md").unlink()


@pytest.fixture(scope="module")
def command_lines(tmp_path_factory):
    """The first command lines of the CLI tests below, all from one interpreter
    (`launch_many`): {test: (their results in order, the folder they wrote in)}."""
    groups = {}
    cli = tmp_path_factory.mktemp("cli")
    groups["cli"] = (cli, [[f"--model={cli / 'nothing'}", "--text=x", f"--out={cli / 'x'}"]])
    bad = tmp_path_factory.mktemp("bad")
    groups["bad"] = (
        bad,
        [[*flags, f"--out={bad / f'out{i}'}"] for i, (flags, _) in enumerate(bad_files(bad))],
    )
    mesh, model = tmp_path_factory.mktemp("mesh"), f"--model={HF / 'llama-tiny'}"
    groups["mesh"] = (
        mesh,
        [
            *[[model, "--text=hi", f"--mesh={value}"] for value in MESH_VALUES],
            [model, "--text=hi", "--mesh=data:64,model:64"],
            [model, *MESH_FLAGS, f"--out={mesh / 'sharded'}", "--mesh=data:1,model:2"],
        ],
    )
    series_folder = tmp_path_factory.mktemp("series")
    for step in (100, 20):
        shutil.copytree(HF / "gpt2-tiny", series_folder / "ckpts" / f"step{step}")
    analysed_series(series_folder)
    groups["series"] = (
        series_folder,
        # The series resumed (nothing left to analyse with these flags' settings), then
        # the same folder with another horizon (refused, run after it).
        [
            [*series_flags(series_folder), *SPEC_FLAGS],
            [*series_flags(series_folder), "--horizon=30", "--max_steps=40", "--nopairwise"],
        ],
    )
    runs = iter(analyze_many(*[line for _, lines in groups.values() for line in lines]))
    return {name: ([next(runs) for _ in lines], folder) for name, (folder, lines) in groups.items()}


def test_analyze_cli(command_lines):
    # The good command line is the mesh test's (one analysis of a text, its report written
    # where --out says); one on a single device is tests/test_launchers.py's "text_report".
    (*_, done), mesh = command_lines["mesh"]
    (failed,), tmp_path = command_lines["cli"]
    assert done.returncode == 0, done.stderr[-2000:]
    out = mesh / "sharded"
    assert (out / "report.md").exists() and (out / "sink_share.png").exists()
    assert f"wrote {out / 'report.md'}" in done.stdout
    assert (
        failed.returncode == 2
        and "must be a checkpoint folder, a GGUF file or a model name" in failed.stderr
    )
    assert not (tmp_path / "x").exists()


def test_operator_fields_of_both_walks_come_from_one_sweep():
    """Reference and normalised walks are measured in one kernel pass: each field equals
    its own kernel with horizon and step cap kept apart."""
    ops = graphs.random_causal(2, (2, 5), 12, dtype=np.float64)
    spec = measure.MeasureSpec(horizon=15, max_steps=25, eps=0.3)
    fields = measure.operator_fields(ops, spec)
    norm = metrics.operator_metrics(ops, 15, 25, 0.3, "normalized")
    node = np.asarray(norm.node_fidelity)
    np.testing.assert_allclose(fields["fidelity"], norm.minimax_fidelity, rtol=1e-12)
    np.testing.assert_allclose(fields["fidelity_median"], np.median(node, -1), rtol=1e-12)
    np.testing.assert_allclose(
        fields["hitting_time_reference"], metrics.hitting_time(ops, 25, "reference"), rtol=1e-12
    )
    np.testing.assert_allclose(fields["hitting_time_normalized"], norm.hitting_time, rtol=1e-12)
    np.testing.assert_array_equal(fields["tv_mixing_time_normalized"], norm.tv_mixing_time)
    np.testing.assert_allclose(
        fields["spectral_mixing_time_normalized"], norm.spectral_mixing_time, rtol=1e-12
    )


# ---------------------------------------------------------------- sink-aware measures


@pytest.mark.float64
def test_sink_mass_and_drop_closed_forms():
    attn = np.tril(np.random.default_rng(0).random((2, 3, 6, 6)))
    attn /= attn.sum(-1, keepdims=True)
    np.testing.assert_allclose(graphs.sink_mass(attn), attn[..., 0].mean(-1))
    np.testing.assert_allclose(graphs.sink_mass(attn, 2), attn[..., :2].sum(-1).mean(-1))
    dropped = np.asarray(graphs.drop_sink_tokens(attn, 2))
    rest = attn[..., 2:, 2:]
    np.testing.assert_allclose(dropped, rest / rest.sum(-1, keepdims=True), rtol=1e-12)
    parked = np.zeros((4, 4))
    parked[:, 0] = 1  # every query reads only token 0
    np.testing.assert_array_equal(graphs.drop_sink_tokens(parked, 1), np.eye(3))
    with pytest.raises(ValueError, match=r"sink_tokens must be in \[0, 5\) for T=6 tokens, got 5"):
        graphs.drop_sink_tokens(attn, 5)


def test_uniform_baseline_closed_form():
    """Uniform causal attention keeps exactly 1/T of its worst token: in float32, as the
    records compute it, shorter than SPEC's horizon, and at the 44 tokens of SHORT (the
    program of `short_record`'s baseline) and the 42 left of it without two sink tokens
    (the sink test's), both past the horizon."""
    for t in (5, 44, 42):
        base = measure.baseline(t, SPEC)
        assert base["fidelity"] == pytest.approx(1 / t, rel=1e-5)


def test_sink_tokens_analysis_measures_the_graph_without_them():
    # SPEC's walks: the per-head programs of `short_record("llama-tiny")`.
    spec = dataclasses.replace(SPEC, sink_tokens=2)
    record = text_lib.text_record(HF / "llama-tiny", SHORT, spec)
    module, params, tokenizer = pretrained.load(HF / "llama-tiny")
    ids = np.asarray([tokenizer.encode(SHORT).ids])
    _, attn = pretrained.apply_with_attention(module, params, ids)
    t = ids.shape[1]
    layer = record["layers"][1]
    np.testing.assert_allclose(layer["sink_mass"], graphs.sink_mass(attn[:, 1], 2), rtol=1e-6)
    dropped = graphs.drop_sink_tokens(attn[:, 1], 2)
    node = np.asarray(metrics.node_fidelity(dropped, 40))
    inner = layer["without_sink"]["heads"]
    np.testing.assert_allclose(inner["fidelity"], node.min(-1), rtol=1e-5)
    np.testing.assert_allclose(inner["fidelity_median"], np.median(node, -1), rtol=1e-5)
    np.testing.assert_allclose(inner["fidelity_p10"], np.percentile(node, 10, -1), rtol=1e-5)
    assert record["baseline_without_sink"]["fidelity"] == pytest.approx(1 / (t - 2), rel=1e-5)
    report = text_report.markdown(record)
    assert "without the first 2 token(s)" in report and "baseline: uniform causal" in report
    with pytest.raises(ValueError, match="--sink_tokens must be less than the window minus 1"):
        text_lib.text_record(HF / "llama-tiny", "one two", dataclasses.replace(spec, sink_tokens=5))


# ---------------------------------------------------------------- bad input, series


def bad_files(tmp_path: Path) -> list[tuple[list[str], str]]:
    """Command lines whose text or model file is bad, each with what its error must say;
    the files are written under `tmp_path`."""
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("caf\xe9 au lait".encode("latin-1"))
    folder = tmp_path / "cut"
    shutil.copytree(HF / "llama-tiny", folder, dirs_exist_ok=True)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:5000])
    gguf_cut = tmp_path / "model.gguf"
    gguf_cut.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 8)
    return [
        (
            [f"--model={HF / 'gpt2-tiny'}", f"--text_file={latin}"],
            f"--text_file {latin} must be UTF-8 text, got byte 0xe9",
        ),
        (
            [f"--model={HF / 'gpt2-tiny'}", f"--text_file={tmp_path}"],
            f"--text_file {tmp_path} cannot",
        ),
        ([f"--model={folder}", "--text=hello there"], f"weights file {weights}"),
        ([f"--model={gguf_cut}", "--text=hello there"], f"GGUF file {gguf_cut} cannot be read"),
        (
            [f"--model={HF / 'gpt2-tiny'}", "--text=hello there", "--sink_tokens=9"],
            "--sink_tokens must be less than the window minus 1",
        ),
    ]


def test_analyze_cli_bad_files_are_one_line_each(command_lines):
    runs, tmp_path = command_lines["bad"]
    cases = bad_files(tmp_path)
    outs = [tmp_path / f"out{i}" for i in range(len(cases))]
    for (flags, message), out, done in zip(cases, outs, runs, strict=True):
        assert done.returncode == 2, (flags, done.stderr[-1500:])
        assert done.stderr.strip().count("\n") == 0 and message in done.stderr, done.stderr
        assert not out.exists()


@pytest.mark.parametrize("data,model", [(1, 4), (2, 2)])
def test_text_record_on_a_mesh_is_the_one_device_record(data, model):
    want = short_record("llama-tiny")
    mesh = parallel.model_mesh(data, model)
    got = text_lib.text_record(HF / "llama-tiny", SHORT, SPEC, mesh=mesh)
    for layer in (0, 1):
        for field in ("fidelity", "hitting_time_reference", "fidelity_median"):
            np.testing.assert_allclose(
                got["layers"][layer]["heads"][field],
                want["layers"][layer]["heads"][field],
                rtol=1e-4,
                atol=1e-6,
            )
        np.testing.assert_allclose(
            got["layers"][layer]["sink_mass"], want["layers"][layer]["sink_mass"], rtol=1e-5
        )
        np.testing.assert_allclose(
            got["layers"][layer]["mixes"]["learned"]["fidelity"],
            want["layers"][layer]["mixes"]["learned"]["fidelity"],
            rtol=1e-4,
        )
    np.testing.assert_allclose(
        got["rollout"]["sink_share"], want["rollout"]["sink_share"], rtol=1e-4, atol=1e-7
    )


def test_analyze_cli_mesh_flag(command_lines):
    (*bad, too_many, done), tmp_path = command_lines["mesh"]
    out = tmp_path / "sharded"
    for value, refused in zip(MESH_VALUES, bad, strict=True):
        assert refused.returncode == 2
        want = f"error: --mesh must be data:D,model:M with integers D, M >= 1, got {value!r}"
        assert refused.stderr.strip() == want
    assert too_many.returncode == 2
    assert "--mesh data:64,model:64 must use at most" in too_many.stderr
    assert too_many.stderr.strip().count("\n") == 0
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads((out / "analysis.json").read_text())["layers"]["1"]["heads"]["fidelity"]
    # The same analysis on one device, in this process (the flags above are SPEC's).
    want = short_record("llama-tiny")["layers"][1]["heads"]["fidelity"]
    np.testing.assert_allclose(got, want, rtol=1e-4)


def test_series_of_checkpoints_resumes_and_refuses_other_settings(command_lines):
    (done, refused), tmp_path = command_lines["series"]
    out = tmp_path / "series"
    # The command line resumed the series this process analysed (its flags are
    # SERIES_SPEC, or it would have been refused): it analysed nothing again, and wrote
    # the summary; a refusal on the command line is its one-line exit 2.
    assert done.returncode == 0, done.stderr[-2000:]
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "other settings (spec.horizon: 40 -> 30)" in refused.stderr.strip().splitlines()[-1]
    report = (out / "series.md").read_text()
    assert report.index("| step 20 |") < report.index("| step 100 |")
    lines = (out / "series.jsonl").read_text().splitlines()
    assert len(lines) == 2
    assert (out / "step20" / "report.md").stat().st_mtime_ns == OLD_NS
    record = short_record("gpt2-tiny")  # ckpts/step20 is a copy of it, measured with SPEC
    first = json.loads(lines[1])  # step20 sorts after step100 as a path
    assert first["label"] == "step 20"
    uniform = 100 * np.mean(record["layers"][1]["mixes"]["uniform"]["fidelity"])
    assert first["layers"]["1"]["uniform_fidelity_pct"] == pytest.approx(uniform, rel=1e-6)
    # The rerun in this process resumes too; another horizon is refused.
    models = series.expand(str(tmp_path / "ckpts" / "step*"))
    series.run(models, SHORT, SERIES_SPEC, out, progress=False)
    assert len((out / "series.jsonl").read_text().splitlines()) == 2
    assert (out / "step20" / "report.md").stat().st_mtime_ns == OLD_NS
    other = dataclasses.replace(SERIES_SPEC, horizon=30)
    with pytest.raises(ValueError, match=r"other settings \(spec.horizon: 40 -> 30\)"):
        series.run(models, SHORT, other, out, progress=False)
    assert series.label("pythia-160m/step143000") == "step 143000"
    assert series.label("/models/final") == "final"
    with pytest.raises(ValueError, match="matches no file or folder"):
        series.expand(str(tmp_path / "none*"))


def test_largest_shares_name_the_tokens_in_order():
    record = short_record("gpt2-tiny")
    top = record["rollout"]["largest_shares"]
    share = np.asarray(record["rollout"]["sink_share"][0])
    assert [t["position"] for t in top] == np.argsort(-share)[:10].tolist()
    assert top[0]["token"] == record["token_labels"][top[0]["position"]]
    assert top[0]["share"] == pytest.approx(share.max())


@pytest.mark.parametrize("keep_bytes", [None, 0])
def test_sink_rollout_kept_or_carried_is_the_rollouts_sink_row(keep_bytes):
    # None: every layer's mix fits and is kept; 0: none fits, the running product is carried.
    rng = np.random.default_rng(3)
    attn = np.tril(rng.random((2, 3, 4, 7, 7))) + np.eye(7)  # B x L x H x T x T, causal
    attn /= attn.sum(-1, keepdims=True)
    weights = rng.dirichlet(np.ones(4), size=3)
    rollout = text_lib.SinkRollout(3, 0.3, keep_bytes)
    for layer in range(3):
        rollout.add(graphs.combine_heads(attn[:, layer].astype(np.float32), weights[layer]))
    assert (len(rollout.kept), rollout.product is None) == (
        (3, True) if keep_bytes is None else (0, False)
    )
    share = rollout.sink_share()
    full = np.asarray(graphs.rollout(attn, weights, 0.3))
    np.testing.assert_allclose(share, full[:, -1], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(share.sum(-1), 1.0, rtol=1e-5)


def test_sink_rollout_keeps_mixes_only_while_all_layers_fit():
    mixed = np.full((2, 5, 5), 0.2, np.float32)  # 200 bytes a layer
    fits, too_big = text_lib.SinkRollout(4, 0.5, 800), text_lib.SinkRollout(4, 0.5, 799)
    for rollout in (fits, too_big):
        rollout.add(mixed)
    assert len(fits.kept) == 1 and fits.product is None
    assert not too_big.kept and too_big.product is not None
    assert text_lib.SinkRollout(4, 0.5).keep_bytes == text_lib.ROLLOUT_KEEP_BYTES == 2**30
