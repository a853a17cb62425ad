"""Analyse the heads of a pretrained model on one text, or attention computed elsewhere:

python launch/analyze.py --model=gpt2 --text="The heads of a layer ..." --out=out/analysis
python launch/analyze.py --model=path/to/checkpoint --text_file=notes.txt --layers=0,5,11
python launch/analyze.py --attention=attn.npz        # key 'attention': L x H x T x T or B x ...
python launch/analyze.py --model=model.gguf --text_file=notes.txt --sink_tokens=1
python launch/analyze.py --model=model.gguf --corpus=docs.jsonl --tokens=512 --max_windows=100
python launch/analyze.py --model='runs/pythia/step*' --text_file=notes.txt --out=out/series
python launch/analyze.py --model='runs/pythia/step*' --corpus=docs.jsonl --tokens=512 --out=out/s
python launch/analyze.py --model=model.gguf --corpus=docs.jsonl --tokens=512 --mesh=data:2,model:4
python launch/analyze.py --model=model.gguf --corpus=docs.jsonl --tokens=128 --coalitions

--model is a folder (config.json, *.safetensors, tokenizer.json), a name in the local
Hugging Face cache, or a GGUF file (llama.cpp, Ollama blobs); nothing is downloaded.
Several models (comma-separated, or a glob) are a series, on a text or a corpus: one
record per model in series.jsonl, a report against the checkpoint, and a rerun skips what
is recorded (for a corpus, each model's windows resume too). --mesh spreads the weights
over data x model devices (heads and MLP features along model, windows along data). With
--optimal_weights the optimum is cross-fitted: searched on windows (or sequences) outside
each of --folds folds and measured on the fold, beside its in-sample value. With
--coalitions every coalition of each layer's heads is a game, on fidelity (its mix) and on
the loss (the model with the layer's other heads masked, on --coalition_windows windows):
Shapley values, pair and triple dividends, pairwise interaction. A bad flag or input is
one line on stderr and exit status 2.
"""

from absl import flags, logging

from beyondpar import measure
from beyondpar.analysis import corpus, corpus_report, series, text_report
from beyondpar.analysis import text as text_lib
from beyondpar.base import cli, files, parallel

MODEL = flags.DEFINE_string("model", None, "Checkpoint folder, cached model name or GGUF file.")
TEXT = flags.DEFINE_string("text", None, "The text to analyse.")
TEXT_FILE = flags.DEFINE_string("text_file", None, "A file holding the text.")
CORPUS = flags.DEFINE_string(
    "corpus", None, "A .txt (documents split by blank lines), a .jsonl ('text') or a folder."
)
TOKENS = flags.DEFINE_integer("tokens", None, "Window length for --corpus (tokens).")
MAX_WINDOWS = flags.DEFINE_integer("max_windows", None, "At most this many windows, in order.")
BATCH = flags.DEFINE_integer("batch_size", 8, "Windows per batch (--corpus).")
PRUNING = flags.DEFINE_bool("pruning", False, "Pruning curves of the loss (--corpus).")
SEARCH_WINDOWS = flags.DEFINE_integer(
    "search_windows", 8, "Windows each fold's optimal weights are searched on (--corpus)."
)
ATTENTION = flags.DEFINE_string("attention", None, ".npz with attention from elsewhere.")
LAYERS = flags.DEFINE_list("layers", None, "Layers to analyse (from 0); default all.")
OUT = flags.DEFINE_string("out", "out/analysis", "Report folder.")
DTYPE = flags.DEFINE_enum("dtype", None, ["float32", "bfloat16", "float16"], "Cast weights.")
HORIZON = flags.DEFINE_integer("horizon", 100, "Fidelity horizon K.")
MAX_STEPS = flags.DEFINE_integer("max_steps", 100, "Step cap of the walks.")
RESIDUAL = flags.DEFINE_float("residual", 0.5, "Residual share of each layer in the rollout.")
PAIRWISE = flags.DEFINE_bool("pairwise", True, "Pairwise synergy (H^2/2 extra operators).")
OPTIMAL = flags.DEFINE_bool("optimal_weights", False, "Search optimal head weights (slow).")
MESH = flags.DEFINE_string(
    "mesh",
    None,
    "data:D,model:M: weights split over M devices (heads, MLP features), batches over D; "
    "default: the weights on one device.",
)
FOLDS = flags.DEFINE_integer("folds", 2, "Folds the optimal weights are cross-fitted over.")
SINK_TOKENS = flags.DEFINE_integer(
    "sink_tokens", 0, "Also measure the graph without the first k tokens (0: off)."
)
COALITIONS = flags.DEFINE_bool(
    "coalitions", False, "Every coalition of each layer's heads as a game (fidelity, loss)."
)
COALITION_WINDOWS = flags.DEFINE_integer(
    "coalition_windows", 8, "Windows the loss game is played on (--corpus --coalitions; 0: none)."
)
EXACT_HEADS = flags.DEFINE_integer(
    "exact_coalition_heads", 10, "Up to this many heads every coalition is valued; else sampled."
)
PERMUTATIONS = flags.DEFINE_integer(
    "permutations", 32, "Sampled head orders for Shapley values beyond --exact_coalition_heads."
)
CORPUS_ONLY = (
    "tokens",
    "max_windows",
    "batch_size",
    "pruning",
    "search_windows",
    "coalition_windows",
)


def spec() -> measure.MeasureSpec:
    return measure.MeasureSpec(
        horizon=HORIZON.value,
        max_steps=MAX_STEPS.value,
        residual=RESIDUAL.value,
        layers=layers(),
        pairwise=PAIRWISE.value,
        optimal_weights=OPTIMAL.value,
        sink_tokens=SINK_TOKENS.value,
        folds=FOLDS.value,
        coalitions=COALITIONS.value,
        exact_coalition_heads=EXACT_HEADS.value,
        permutations=PERMUTATIONS.value,
    )


def layers() -> tuple[int, ...] | None:
    if LAYERS.value is None:
        return None
    bad = [x for x in LAYERS.value if not x.strip().isdigit()]
    if bad:
        raise ValueError(f"--layers must be layer numbers from 0 (e.g. 0,5,11), got {bad}")
    return tuple(int(x) for x in LAYERS.value)


def check_flag_rules() -> str:
    """What to analyse ('attention', 'corpus' or 'text'); a broken rule is a ValueError."""
    cli.exactly_one(model=MODEL.value, attention=ATTENTION.value)
    if ATTENTION.value:
        given = [f"--{n}" for n in ("text", "text_file", "corpus") if flags.FLAGS[n].value]
        if given:
            raise ValueError(f"--attention takes no text or corpus, got {', '.join(given)}")
        return "attention"
    source = cli.exactly_one(text=TEXT.value, text_file=TEXT_FILE.value, corpus=CORPUS.value)
    if source == "corpus" and TOKENS.value is None:
        raise ValueError("--corpus needs --tokens=T, the window length in tokens, got none")
    misplaced = [f"--{n}" for n in CORPUS_ONLY if source != "corpus" and flags.FLAGS[n].present]
    if misplaced:
        raise ValueError(f"{', '.join(misplaced)}: for --corpus only, got --{source}")
    return "corpus" if source == "corpus" else "text"


def read_text_file(path: str) -> str:
    """The --text_file's text (`files.read_utf8`: a missing, binary or non-UTF-8 file is a
    ValueError naming it)."""
    return files.read_utf8(path, "--text_file")


def mesh():
    """The --mesh flag's device mesh, or None (the weights on one device)."""
    return None if MESH.value is None else parallel.mesh_from_flag(MESH.value)


def analyse_corpus() -> list:
    cspec = corpus.CorpusSpec(
        tokens=TOKENS.value,
        max_windows=MAX_WINDOWS.value,
        batch_size=BATCH.value,
        pruning=PRUNING.value,
        search_windows=SEARCH_WINDOWS.value,
        coalition_windows=COALITION_WINDOWS.value,
    )
    models = series.expand(MODEL.value)
    if len(models) > 1:
        _, written = series.run_corpus(
            models, CORPUS.value, cspec, spec(), OUT.value, DTYPE.value, mesh=mesh()
        )
        return [written]
    summary, _ = corpus.run(
        models[0], CORPUS.value, cspec, spec(), OUT.value, DTYPE.value, mesh=mesh()
    )
    return corpus_report.write(summary, OUT.value)


def analyse_text() -> list:
    text = TEXT.value if TEXT.value else read_text_file(TEXT_FILE.value)
    models = series.expand(MODEL.value)
    if len(models) > 1:
        _, written = series.run(models, text, spec(), OUT.value, DTYPE.value, mesh=mesh())
        return [written]
    return text_report.write(
        text_lib.text_record(models[0], text, spec(), DTYPE.value, mesh()), OUT.value
    )


def analyse_attention() -> list:
    return text_report.write(text_lib.attention_record(ATTENTION.value, spec()), OUT.value)


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    what = check_flag_rules()
    run = {"attention": analyse_attention, "corpus": analyse_corpus, "text": analyse_text}
    for path in run[what]():
        print(f"wrote {path}")


if __name__ == "__main__":
    parallel.use_all_cpu_cores()
    cli.run(main)
