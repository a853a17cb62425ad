"""Evaluation of checkpoints: the paper's numbers, trees of runs, failures, resumption."""

import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from beyondpar import checkpoints, graphs, measure, metrics, pruning, synergy, tasks, weighting
from beyondpar.base import parallel
from beyondpar.measure import record
from beyondpar.study import attention_view, evaluate, report
from helpers.paths import DATA


def model_forward(module, params, inputs):
    """The model's logits, float32 attention and head weights from `evaluate.forward`, its
    parameters and sequences placed as an evaluation places them: the evaluation's own
    compiled program, run on any parameters of the model."""
    return evaluate.forward(module, *evaluate.placed(params, inputs))


def without_heads(params, mask):
    """`params` with each head that `mask` (L x H, 0 = removed) cut out of its layer's
    output projection (the rows that read its output): those heads ablated in the
    weights themselves."""

    def cut(path, leaf):
        name = jax.tree_util.keystr(path)
        for layer, keep in enumerate(np.asarray(mask)):
            if name == f"['layers_{layer}']['attn']['out']['kernel']":
                rows = np.repeat(keep, leaf.shape[0] // len(keep)).astype(leaf.dtype)
                return np.asarray(leaf) * rows[:, None]
        return leaf

    return jax.tree_util.tree_map_with_path(cut, params)


def test_reference_checkpoints_reproduce_the_paper(fixture):
    name, _, expected = fixture
    heads, task = name.split("_heads_")
    module, params = checkpoints.import_reference(DATA / f"{name}.npz", int(heads))
    examples = tasks.label(task, expected["tokens"], module.config.vocab_size)
    # The paper's fields only: the weight search (an operator more per objective) is
    # checked, with the fields it shifts, in test_every_record_field_... below.
    spec = evaluate.EvalSpec(optimal_weights=False, pruning=False)
    got = evaluate.per_sequence(module, params, examples, spec)
    rtol = 1e-4  # float32 attention from the model, as the paper's pipeline
    np.testing.assert_allclose(got["fidelity"], expected["fidelity_learned"] / 100, rtol=rtol)
    np.testing.assert_allclose(
        got["fidelity_uniform"], expected["fidelity_uniform"] / 100, rtol=rtol
    )
    np.testing.assert_allclose(
        got["fidelity_per_head"], expected["fidelity_per_head"] / 100, rtol=rtol
    )
    for walk in ("reference", "normalized"):
        np.testing.assert_allclose(
            got[f"hitting_time_{walk}"], expected[f"hitting_time_{walk}"], rtol=rtol
        )
    np.testing.assert_allclose(got["head_weights"][0], expected["head_weights"], rtol=1e-6)
    best = (expected["fidelity_per_head"] / 100).max(-1)
    np.testing.assert_allclose(got["gain"], expected["fidelity_learned"] / 100 - best, atol=1e-8)


@pytest.fixture(scope="module")
def short_record():
    """The released 1-head cycle checkpoint's record on 3 sequences of 8 tokens (below its
    maximum length), shared by the tests of what it says."""
    spec = evaluate.EvalSpec(
        num_sequences=3, horizon=20, max_steps=20, optimal_weights=False, pruning=False
    )
    return evaluate.evaluate_reference(DATA / "1_heads_cycle.npz", spec, seq_len=8)


def test_reference_record_names_task_and_heads(short_record):
    record = short_record
    assert (record["task"], record["heads"], record["num_sequences"]) == ("cycle", 1, 3)
    assert record["metrics"]["accuracy_predictable"]["mean"] > 0.99
    assert len(record["metrics"]["fidelity"]["mean"]) == 4
    with pytest.raises(ValueError, match=r"named <H>_heads_<task>.npz or .pt, got 'x.npz'"):
        evaluate.evaluate_reference(Path("x.npz"))


@pytest.fixture(scope="module")
def tree(two_epoch_run, tmp_path_factory):
    """Two finished smoke runs under one folder (no weight search or pruning: tested on
    their own)."""
    root = tmp_path_factory.mktemp("tree")
    shutil.copytree(two_epoch_run, root / "a")
    shutil.copytree(two_epoch_run, root / "group" / "b")
    return root


def test_tree_evaluation_resumes_and_covers_all_steps(tree, tmp_path):
    root = tmp_path / "runs"
    shutil.copytree(tree, root)
    new, failures = evaluate.evaluate_tree(root, progress=False)
    assert failures == []
    assert sorted((r["run"], r["step"]) for r in new) == [("a", 16), ("group/b", 16)]
    again, _ = evaluate.evaluate_tree(root, progress=False)
    assert again == []  # everything recorded is skipped
    more, _ = evaluate.evaluate_tree(root, steps="all", progress=False)
    assert sorted((r["run"], r["step"]) for r in more) == [("a", 8), ("group/b", 8)]
    records = evaluate.read_records(root / evaluate.RECORDS_FILE)
    assert len(records) == 4
    a, b = (next(r for r in records if r["run"] == n and r["step"] == 16) for n in ("a", "group/b"))
    assert a["metrics"] == b["metrics"]  # the same weights give the same numbers
    assert a["metrics"]["fidelity"]["mean"][0] > 0 and len(a["metrics"]["fidelity"]["mean"]) == 2


def test_corrupt_checkpoint_is_reported_and_skipped(tree, tmp_path):
    """A copy of `tree` whose group/b@16 is corrupt and whose records end in a torn line,
    evaluated in this process (the model's programs are those of the tree test above):
    the corrupt checkpoint is a named failure, the others are recorded and reported."""
    root = tmp_path / "runs"
    shutil.copytree(tree, root)
    step_dir = root / "group" / "b" / "checkpoints" / "16"
    for f in step_dir.rglob("*"):
        if f.is_file() and f.stat().st_size > 0 and "metadata" not in f.name:
            f.write_bytes(b"\0" * 7)
    with open(root / evaluate.RECORDS_FILE, "w") as f:
        f.write('{"run": "torn')  # a writer killed mid-line
    new, failures = evaluate.evaluate_tree(root, progress=False)
    assert [name for name, _ in failures] == ["group/b@16"]
    assert [(r["run"], r["step"]) for r in new] == [("a", 16)]
    records = evaluate.read_records(root / evaluate.RECORDS_FILE)
    assert [(r["run"], r["step"]) for r in records] == [("a", 16)]
    report.write_report(records, root / "report", failures, runs_root=root)
    assert (root / "report" / "report.md").read_text().count("| a | 16 | copy | 2 | 0 |") == 1


def test_bad_steps_argument(tmp_path):
    with pytest.raises(ValueError, match="steps must be 'latest' or 'all', got 'first'"):
        evaluate.evaluate_tree(tmp_path, steps="first")
    with pytest.raises(FileNotFoundError, match="runs directory must be an existing folder"):
        evaluate.evaluate_tree(tmp_path / "nope")


def test_committed_arrays_are_accepted():
    c = jax.device_put(np.eye(4)[[0, 0, 1, 2]], jax.devices()[1])
    assert np.isfinite(float(evaluate.metrics.hitting_time(c, 10)))


# The weight search's horizon and steps: distinct, so a kernel run with the other fails.
HORIZON, MAX_STEPS, EPS = 30, 40, 0.3
# The horizon of the evaluation without the search: at 3 steps most tokens' signal is still
# reaching the sink, so the page's flows over one step more differ.
SHORT_HORIZON = 3


def copy_on_two_folds():
    """The 4-head copy checkpoint, its learned head weights and four sequences of 40 tokens
    in two folds (the fixture's two, then the two reversed), labelled."""
    module, params = checkpoints.import_reference(DATA / "4_heads_copy.npz", 4)
    expected = dict(np.load(DATA / "4_heads_copy.expected.npz"))
    tokens = np.concatenate([expected["tokens"], expected["tokens"][::-1, ::-1]])[:, :40]
    examples = tasks.label("copy", tokens, module.config.vocab_size)
    return module, params, expected["head_weights"], examples


def evaluated(spec):
    """(the per-sequence values of the evaluation of `copy_on_two_folds` under `spec`, its
    attention in float64, the learned head weights, its record). The values are those the
    record summarises, taken as `evaluate_params` hands them to `evaluate.summarize`: one
    evaluation gives the fields and the page's view."""
    module, params, weights, examples = copy_on_two_folds()
    values = {}
    summarize = evaluate.summarize
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(evaluate, "summarize", lambda v: values.update(v) or summarize(v))
        record = evaluate.evaluate_params(module, params, examples, spec)
    _, attn, _ = model_forward(module, params, examples.inputs)
    return values, np.asarray(attn, np.float64), weights, record


@pytest.fixture(scope="module")
def searched():
    """`evaluated` with the weight search: one search shared by the tests of its fields."""
    return evaluated(
        evaluate.EvalSpec(horizon=HORIZON, max_steps=MAX_STEPS, eps=EPS, pruning=False)
    )


@pytest.fixture(scope="module")
def normalized():
    """`evaluated` on the normalised walk, without the search, at the short horizon."""
    spec = evaluate.EvalSpec(
        walk="normalized",
        horizon=SHORT_HORIZON,
        max_steps=MAX_STEPS,
        eps=EPS,
        optimal_weights=False,
        pruning=False,
    )
    return evaluated(spec)


def test_every_record_field_is_the_kernel_on_the_operator_it_names(searched):
    """Fields of the learned mix come from the learned mix, per-head fields from each head,
    with the optimal mixes among the operators (they shift where the uniform mix and the
    heads sit)."""
    got, attn, weights, record = searched
    fidelity = np.asarray(got["fidelity"], np.float64).mean(0).tolist()
    assert record["metrics"]["fidelity"]["mean"] == fidelity  # the record's own values
    assert_fields_are_their_kernels(got, attn, weights, "reference", HORIZON, MAX_STEPS, EPS)


def test_every_record_field_on_the_normalized_walk_without_the_search(normalized):
    """Without the optimal mixes, on the normalised walk: it shows TV mixing unsaturated,
    so a field from the wrong operator cannot agree by accident."""
    got, attn, weights, _ = normalized
    on = assert_fields_are_their_kernels(
        got, attn, weights, "normalized", SHORT_HORIZON, MAX_STEPS, EPS
    )
    uniform_tv = on["tv_mixing_time"][:, :, UNIFORM]
    assert np.any(np.asarray(got["tv_mixing_time"]) != uniform_tv)
    uniform_hit = on["hitting_time"][:, :, UNIFORM]
    assert np.abs(np.asarray(got["hitting_time"]) - uniform_hit).max() > 1e-3


# Where the learned and the uniform mix sit among the operators the kernels run on: the
# two mixes, then the heads, one batch (N x L x (2 + H) x T x T) that each kernel compiles
# once for, rather than once per kind of operator.
LEARNED, UNIFORM, HEADS = 0, 1, slice(2, None)


def operators_of(attn, *mixes):
    """`attn` (N x L x H x T x T) with each mix of its heads (weights L x H or N x L x H)
    first, along the head axis."""
    mixed = [graphs.combine_heads(attn, np.broadcast_to(w, attn.shape[:3])) for w in mixes]
    return np.concatenate([np.stack(mixed, 2), np.asarray(attn, np.float32)], axis=2)


def assert_fields_are_their_kernels(got, attn, weights, walk, horizon, max_steps, eps):
    """Each field of `got` is its kernel run on the operator it names; returns the kernels'
    values on every operator (`LEARNED`, `UNIFORM`, `HEADS` along axis 2)."""
    ops = operators_of(attn, weights, np.full_like(weights, 1 / weights.shape[-1]))
    other = "normalized" if walk == "reference" else "reference"
    on = {
        "fidelity": metrics.minimax_fidelity(ops, horizon),
        "hitting_time": metrics.hitting_time(ops, max_steps, walk),
        "other_walk": metrics.hitting_time(ops, max_steps, other),
        "tv_mixing_time": metrics.tv_mixing_time(ops, eps, max_steps, walk),
        "spectral_radius": metrics.spectral_radius(ops, walk),
        "spectral_mixing_time": metrics.spectral_mixing_time(ops, eps, max_steps, walk),
    }
    on = {name: np.asarray(value) for name, value in on.items()}
    hit = on["hitting_time"]
    kernels = {
        "fidelity": on["fidelity"][:, :, LEARNED],
        "fidelity_uniform": on["fidelity"][:, :, UNIFORM],
        "fidelity_per_head": on["fidelity"][:, :, HEADS],
        "hitting_time": hit[:, :, LEARNED],
        f"hitting_time_{walk}": hit[:, :, LEARNED],
        f"hitting_time_{other}": on["other_walk"][:, :, LEARNED],
        "hitting_time_uniform": hit[:, :, UNIFORM],
        "hitting_time_per_head": hit[:, :, HEADS],
        "hitting_time_best_head": np.min(hit[:, :, HEADS], axis=-1),
    }
    for name in ("tv_mixing_time", "spectral_radius", "spectral_mixing_time"):
        kernels[name] = on[name][:, :, LEARNED]
    for name, value in kernels.items():
        np.testing.assert_allclose(got[name], value, rtol=2e-4, atol=1e-6, err_msg=name)
    return on


SUFFIXES = ("", "_in_sample")  # the held-out and the in-sample optimum


def test_synergy_fields_of_a_record_are_the_functions_on_its_attention(searched):
    got, attn, *_ = searched
    # The four optimal mixes and two heads: the operators' shape of the field test above,
    # whose compiled kernels score them.
    names = [f"optimal_weights_{o}{s}" for o in ("fidelity", "hitting_time") for s in SUFFIXES]
    ops = operators_of(attn, *(got[name] for name in names))[:, :, :6]
    opt_fid = np.asarray(metrics.minimax_fidelity(ops, HORIZON))
    opt_hit = np.asarray(metrics.hitting_time(ops, MAX_STEPS))
    for i, suffix in enumerate(SUFFIXES):  # per sequence: its own weights, scored on it
        np.testing.assert_allclose(got[f"optimal_weights_fidelity{suffix}"].sum(-1), 1.0, rtol=1e-5)
        fid = opt_fid[:, :, i]
        np.testing.assert_allclose(got[f"fidelity_optimal{suffix}"], fid, rtol=1e-4)
        hit = opt_hit[:, :, 2 + i]
        np.testing.assert_allclose(got[f"hitting_time_optimal{suffix}"], hit, rtol=1e-4)
    # In sample, one weight vector for all sequences: never worse than the learned mix or
    # any one head on the mean over sequences.
    inside = got["fidelity_optimal_in_sample"].mean(0)
    assert np.all(inside >= got["fidelity"].mean(0) - 1e-6)
    best_head = got["fidelity_per_head"].mean(0).max(-1)
    assert np.all(inside >= best_head - 1e-6)
    fastest_head = got["hitting_time_per_head"].mean(0).min(-1)
    assert np.all(got["hitting_time_optimal_in_sample"].mean(0) <= fastest_head + 1e-5)
    # The heads as the evaluation hands them to the kernels: 16 (sequence, layer) sets
    # split over the devices, so that its compiled kernels serve.
    sets = jnp.reshape(parallel.split_over_devices(np.float32(attn)), (-1, *attn.shape[2:]))

    def on_sets(f, *args):
        per_set = np.asarray(f(sets, *args))
        return per_set.reshape(*attn.shape[:2], *per_set.shape[1:])

    np.testing.assert_allclose(got["head_diversity"], on_sets(synergy.head_diversity), rtol=1e-5)
    np.testing.assert_allclose(
        got["pairwise_synergy"], on_sets(synergy.pairwise_synergy, HORIZON), rtol=1e-3, atol=1e-7
    )
    share = np.asarray(synergy.cross_head_share(attn, got["head_weights"][0][None], HORIZON))
    np.testing.assert_allclose(got["cross_head_share_mean"], share.mean(-1), rtol=1e-4, atol=1e-6)
    learned = graphs.combine_heads(attn, got["head_weights"][0][None])
    worst = np.argmin(metrics.node_fidelity(learned, HORIZON), -1)
    np.testing.assert_allclose(
        got["cross_head_share_minimax"],
        np.take_along_axis(share, worst[..., None], -1)[..., 0],
        rtol=1e-3,
        atol=1e-6,
    )


def test_the_optimum_of_each_sequence_is_searched_on_the_other_fold(searched):
    """Four sequences in two folds: the two of a fold share their weights, and those
    weights are optimal where they were searched, on the other fold: there no anchor of the
    search (uniform, learned, each head) beats them, while on their own fold one may."""
    got, attn, *_ = searched
    w = got["optimal_weights_fidelity"]  # N x L x H
    np.testing.assert_array_equal(w[0], w[1])
    np.testing.assert_array_equal(w[2], w[3])
    assert np.abs(w[0] - w[2]).max() > 1e-3
    learned = got["head_weights"][0]
    # Sequences 0, 1 scored with the weights searched on them (fold 2, 3's), and 2, 3 with
    # fold 0, 1's; then every anchor: the learned mix, the uniform one and each head alone.
    ops = operators_of(attn, w[[2, 2, 0, 0]], learned, np.full_like(learned, 0.25))
    # Two batches of the field test's operators' shape: its compiled kernel scores them.
    first, last = (
        np.asarray(metrics.minimax_fidelity(o, HORIZON)) for o in (ops[:, :, :6], ops[:, :, 1:])
    )
    scores = np.concatenate([first, last[..., 5:]], -1)  # N x L x (1 + 2 + H)
    on_fold = scores.reshape(2, 2, *scores.shape[1:]).mean(1)  # the mean over each fold
    found, anchors = on_fold[..., :1], on_fold[..., 1:]
    assert anchors.shape[-1] == 6
    assert np.all(found >= anchors - 1e-6)


def test_attention_necessity_is_a_true_ablation_of_the_released_checkpoints():
    """The paper's 4-head copy checkpoint needs no head (its target is the current token);
    the 1-head cycle checkpoint falls to about chance without its heads. Each accuracy is
    that of the model whose masked heads are cut out of its weights."""
    found = {}
    # The copy checkpoint on 4 sequences of 40 tokens, the shape of `copy_on_two_folds`,
    # and the cycle checkpoint on 3 of 8, `short_record`'s: the masked passes and the
    # forward passes of the cut models are the programs those fixtures compile.
    cases = (("4_heads_copy", 4, "copy", 4, 40), ("1_heads_cycle", 1, "cycle", 3, 8))
    for name, heads, task, n, seq_len in cases:
        module, params = checkpoints.import_reference(DATA / f"{name}.npz", heads)
        examples = tasks.make_examples(task, jax.random.PRNGKey(0), n, seq_len, 256)
        necessity = pruning.attention_necessity(module, params, examples)
        cases = [
            (np.zeros((4, heads)), necessity["accuracy_without_heads"]),
            (np.ones((4, heads)), necessity["accuracy"]),
        ]
        for layer in range(4):  # each layer's heads masked in turn, in layer order
            mask = np.ones((4, heads)) * (np.arange(4) != layer)[:, None]
            cases.append((mask, necessity["accuracy_without_layer"][layer]))
        for mask, got in cases:
            logits, _, _ = model_forward(module, without_heads(params, mask), examples.inputs)
            predictable = np.asarray(examples.predictable)
            correct = (np.asarray(logits).argmax(-1) == np.asarray(examples.targets)) & predictable
            assert float(got) == pytest.approx(float(correct.sum() / predictable.sum()), abs=1e-6)
        found[task] = necessity
    assert found["copy"]["accuracy_without_heads"] > 0.99 and not found["copy"]["needs_attention"]
    assert found["cycle"]["accuracy"] > 0.99 and found["cycle"]["needs_attention"]
    assert found["cycle"]["accuracy_without_heads"] < 0.05
    assert found["cycle"]["chance"] == 1 / 256
    # Every layer alone suffices for the shift: masking one layer keeps its accuracy.
    assert found["cycle"]["accuracy_without_layer"] == pytest.approx([1.0] * 4, abs=0.02)


def test_attention_necessity_masks_each_layer_in_turn(monkeypatch):
    """The masks themselves (the released checkpoints cannot tell layers apart): all heads,
    none, then layer l alone masked, in layer order; the accuracies map back in order."""
    seen = {}

    def fake(module, params, examples, masks):
        seen["masks"] = np.asarray(masks)
        return np.zeros(len(masks)), np.arange(len(masks), dtype=np.float32) / 10

    monkeypatch.setattr(pruning.head_masking, "masked_scores", fake)
    module, params = checkpoints.import_reference(DATA / "4_heads_copy.npz", 4)
    # The cycle sequences of the ablation test above (3 of 8 tokens): its compiled sampler.
    examples = tasks.make_examples("cycle", jax.random.PRNGKey(0), 3, 8, 256)
    necessity = pruning.attention_necessity(module, params, examples)
    masks = seen["masks"]
    assert masks.shape == (6, 4, 4)
    assert masks[0].all() and not masks[1].any()
    for layer in range(4):
        want = np.ones((4, 4))
        want[layer] = 0
        np.testing.assert_array_equal(masks[2 + layer], want)
    assert necessity["accuracy_without_layer"] == pytest.approx([0.2, 0.3, 0.4, 0.5])
    assert necessity["accuracy"] == 0 and necessity["accuracy_without_heads"] == pytest.approx(0.1)


def test_eval_examples_follow_the_runs_task_lag_seed_and_count():
    """Held-out sequences of a run are its task at its own lag: for `shift` with lag 3,
    target[i] = x[i - 3] and only positions >= 3 are predictable; the count and the seed
    come from the evaluation spec (the same seed gives the same sequences). Three sequences
    of 8 tokens: the shape the ablation test above samples, with its compiled sampler."""
    config = ml_collections.ConfigDict(
        {"task": {"name": "shift", "seq_len": 8, "lag": 3}, "model": {"vocab_size": 11}}
    )
    spec = evaluate.EvalSpec(num_sequences=3, seed=7)
    ex = evaluate.eval_examples(config, spec)
    x, y, mask = (np.asarray(a) for a in ex)
    assert x.shape == y.shape == mask.shape == (3, 8)
    assert x.min() >= 0 and x.max() < 11
    np.testing.assert_array_equal(y[:, 3:], x[:, :-3])
    np.testing.assert_array_equal(mask, np.broadcast_to(np.arange(8) >= 3, (3, 8)))
    again = evaluate.eval_examples(config, spec)
    np.testing.assert_array_equal(np.asarray(again.inputs), x)
    other = evaluate.eval_examples(config, evaluate.EvalSpec(num_sequences=3, seed=8))
    assert not np.array_equal(np.asarray(other.inputs), x)


def test_reference_evaluation_at_a_shorter_length(short_record):
    """`seq_len` below the checkpoint's maximum length evaluates sequences of that length:
    the record says so, and every layer's hitting time lies within the bounds that
    length gives."""
    record = short_record
    assert (record["seq_len"], record["num_sequences"]) == (8, 3)
    assert record["evaluation"]["horizon"] == 20
    # Reference walk on causal attention: token 0 never reaches the sink, so it counts
    # the full 20 steps, the sink counts 0 and every other start at most 20:
    # 20 / 8 <= h <= 20 * 7 / 8.
    for h in record["metrics"]["hitting_time"]["mean"]:
        assert 20 / 8 - 1e-6 <= h <= 20 * 7 / 8 + 1e-6


def test_reference_files_prefer_npz_and_keep_a_lone_pt(tmp_path):
    """A .pt beside its .npz is the same weights and is listed once (as the .npz); a .pt
    with no .npz beside it is listed; expected-output files and other names are not."""
    for name in (
        "4_heads_copy.npz",
        "4_heads_copy.pt",
        "8_heads_cycle.pt",
        "4_heads_copy.expected.npz",
        "notes.txt",
        "model.npz",
    ):
        (tmp_path / name).write_bytes(b"")
    names = [p.name for p in evaluate.reference_files(tmp_path)]
    assert names == ["4_heads_copy.npz", "8_heads_cycle.pt"]


def measured_sets(seed, spec, extra=None):
    """Random causal attention measured as `evaluated` measures the copy checkpoint's: 16
    (sequence, layer) sets of 4 heads on 40 tokens, split over the devices as the
    evaluation splits them, with their own learned weights and `extra` mixes per set, so
    the measurement's compiled kernels are the fixtures'. Returns (attention N x L x H x T
    x T, the measurement record of its 16 sets)."""
    attn = graphs.random_causal(seed, (4, 4, 4), 40)
    per_set = lambda w: np.broadcast_to(np.asarray(w, np.float32), (16, 4)).copy()
    sets = jnp.reshape(parallel.split_over_devices(attn), (16, 4, 40, 40))
    extra = {name: per_set(w) for name, w in (extra or {}).items()}
    return attn, measure.measure_layer(sets, per_set([0.4, 0.3, 0.2, 0.1]), spec, extra=extra)


@pytest.mark.parametrize("walk", ["reference", "normalized"])
def test_optimal_columns_are_each_optimums_own_mix_on_the_walk_evaluated(walk):
    """Each optimum's columns come from the mix of its own name, its hitting times on the
    walk the evaluation runs: four optima with four different weightings of the heads,
    whose numbers differ, so a column read from another mix or walk would not match."""
    mixes = {
        record.OPTIMAL: [1.0, 0.0, 0.0, 0.0],
        record.OPTIMAL_IN_SAMPLE: [0.0, 1.0, 0.0, 0.0],
        record.OPTIMAL_HITTING_TIME: [0.0, 0.0, 1.0, 0.0],
        record.OPTIMAL_HITTING_TIME_IN_SAMPLE: [0.5, 0.5, 0.0, 0.0],
    }
    spec = measure.MeasureSpec(horizon=HORIZON, max_steps=MAX_STEPS, eps=EPS)
    attn, layer = measured_sets(5, spec, mixes)
    got = evaluate.columns(layer, walk)
    # The four mixes and two heads: the operators' shape of the field test, whose compiled
    # kernels score them on both walks.
    ops = operators_of(attn, *mixes.values())[:, :, :6]
    other = "normalized" if walk == "reference" else "reference"
    fidelity = np.asarray(metrics.minimax_fidelity(ops, HORIZON)).reshape(16, 6)
    hitting = {
        on: np.asarray(metrics.hitting_time(ops, MAX_STEPS, on)).reshape(16, 6)
        for on in (walk, other)
    }
    want = {
        "fidelity_optimal": fidelity[:, 0],
        "fidelity_optimal_in_sample": fidelity[:, 1],
        "hitting_time_optimal": hitting[walk][:, 2],
        "hitting_time_optimal_in_sample": hitting[walk][:, 3],
    }
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, err_msg=name)
    off_walk = hitting[other][:, 2]
    assert np.abs(np.asarray(got["hitting_time_optimal"]) - off_walk).max() > 1e-3


def test_a_tie_with_the_best_head_is_no_win():
    """`combined_wins` is 1 where the learned mix beats its best head (gain > 0): a mix
    equal to its best head (gain 0, e.g. a one-head layer's) does not win."""
    # The shapes and spec of the `normalized` fixture: its compiled kernels serve this one.
    spec = measure.MeasureSpec(horizon=SHORT_HORIZON, max_steps=MAX_STEPS, eps=EPS)
    _, layer = measured_sets(6, spec)
    gain = np.tile(np.asarray([0.0, 0.1, -0.1, 0.0], np.float32), 4)
    layer["mixes"][record.LEARNED][record.GAIN.name] = gain
    got = evaluate.columns(layer, "reference")
    np.testing.assert_array_equal(got["combined_wins"], np.tile([0.0, 1.0, 0.0, 0.0], 4))
    np.testing.assert_array_equal(got["gain"], gain)


def test_the_pages_optimal_mix_is_the_held_out_optimum_of_the_first_sequence(searched):
    """The record's attention view draws, beside the learned mix, the first sequence's
    held-out optimum of fidelity (not its in-sample one), at the evaluation's horizon."""
    got, attn, learned, found = searched
    view = found[attention_view.KEY]
    held_out = np.asarray(got["optimal_weights_fidelity"])[0]
    in_sample = np.asarray(got["optimal_weights_fidelity_in_sample"])[0]
    assert not np.allclose(held_out, in_sample)  # the two would tell a swap apart
    for layer, packed in view["layers"].items():
        a = attn[0, int(layer)].astype(np.float32)
        mixes = (learned[int(layer)], np.full(len(a), 1 / len(a)), held_out[int(layer)])
        # The heads and the view's three mixes, the optimal last: the batch the
        # evaluation's own flows compile for.
        on = np.concatenate([a, np.stack([graphs.combine_heads(a, w) for w in mixes])])
        want = np.asarray(metrics.node_fidelity(on, HORIZON))[-1].min()
        assert list(packed["mixes"]) == ["learned", "uniform", "optimal"]
        assert packed["mixes"]["optimal"]["worst_value"] == pytest.approx(float(want), rel=1e-4)


def test_the_pages_flows_are_measured_over_the_evaluations_horizon(normalized):
    """At a horizon of 3 steps most tokens' signal is still reaching the sink, so a flow
    over one step more is larger: the record's view must be the kernels' at exactly the
    evaluation's horizon, for every head and both mixes."""
    _, attn, weights, found = normalized
    view = found[attention_view.KEY]
    horizon = SHORT_HORIZON
    num_layers, num_heads = weights.shape
    mixes = {"learned": weights, "uniform": np.full_like(weights, 1 / num_heads)}
    assert sorted(view["layers"]) == [str(layer) for layer in range(num_layers)]
    for layer, packed in view["layers"].items():
        a = np.asarray(attn, np.float32)[0, int(layer)]
        mixed = [graphs.combine_heads(a, w[int(layer)]) for w in mixes.values()]
        # The heads and the two mixes in one batch (H + 2 operators), the shape the
        # evaluation's own flows compile for: one kernel call per horizon.
        on = np.concatenate([a, np.stack(mixed)])
        phis, laters = (
            np.asarray(metrics.node_fidelity(on, h), np.float64) for h in (horizon, horizon + 1)
        )
        at = {"heads": slice(0, num_heads), "learned": num_heads, "uniform": num_heads + 1}
        shown = {"heads": packed["heads"], **packed["mixes"]}
        assert list(packed["mixes"]) == ["learned", "uniform"]
        for name, i in at.items():
            phi, later = phis[i], laters[i]
            assert np.abs(later - phi).max() > 0.05 * phi.max(), (layer, name)
            np.testing.assert_allclose(shown[name]["values"], phi, rtol=5e-3, atol=1e-9)
            np.testing.assert_allclose(shown[name]["worst_value"], phi.min(-1), rtol=1e-4)


def test_one_head_layers_mix_their_head_alone_without_a_search(monkeypatch):
    """With one head the only mix is the head (weight 1): every optimum is 1 for every
    sequence and layer, and no search is compiled or run (`weighting.optimal_weights`
    returns it at once)."""

    def no_search(*args, **kwargs):
        raise AssertionError("searched a one-head layer")

    monkeypatch.setattr(weighting, "_propose", no_search)
    monkeypatch.setattr(weighting, "pattern_search", no_search)
    attn = np.asarray(graphs.random_causal(3, (5, 4, 1), 12))  # N x L x H x T x T
    weights = np.full((4, 1), 0.7, np.float32)
    got = evaluate.optimal_mixes(attn, weights, evaluate.EvalSpec(pruning=False))
    assert sorted(got) == sorted(
        [
            record.OPTIMAL,
            record.OPTIMAL_IN_SAMPLE,
            record.OPTIMAL_HITTING_TIME,
            record.OPTIMAL_HITTING_TIME_IN_SAMPLE,
        ]
    )
    for name, w in got.items():
        assert w.dtype == np.float32, name
        np.testing.assert_array_equal(w, np.ones((5, 4, 1)), err_msg=name)
