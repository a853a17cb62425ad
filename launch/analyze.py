"""Analyse the heads of a pretrained model on one text, or attention computed elsewhere:

python launch/analyze.py --model=gpt2 --text="The heads of a layer ..." --out=out/analysis
python launch/analyze.py --model=path/to/checkpoint --text_file=notes.txt --layers=0,5,11
python launch/analyze.py --attention=attn.npz        # key 'attention': L x H x T x T or B x ...
python launch/analyze.py --model=model.gguf --text_file=notes.txt --sink_tokens=1
python launch/analyze.py --model=model.gguf --corpus=docs.jsonl --tokens=512 --max_windows=100
python launch/analyze.py --model='runs/pythia/step*' --text_file=notes.txt --out=out/series
python launch/analyze.py --model='runs/pythia/step*' --corpus=docs.jsonl --tokens=512 --out=out/s
python launch/analyze.py --model=model.gguf --corpus=docs.jsonl --tokens=512 --mesh=data:2,model:4

--model is a folder (config.json, *.safetensors, tokenizer.json), a name in the local
Hugging Face cache, or a GGUF file (llama.cpp, Ollama blobs); nothing is downloaded.
Several models (comma-separated, or a glob) are a series, on a text or a corpus: one
record per model in series.jsonl, a report against the checkpoint, and a rerun skips what
is recorded (for a corpus, each model's windows resume too). --mesh spreads the weights
over data x model devices (heads and MLP features along model, windows along data).
"""

import sys
from pathlib import Path

from absl import app, flags, logging

from beyondpar.analysis import corpus_report, measures, series, text_report, windows
from beyondpar.analysis import text as text_lib
from beyondpar.base import locks, parallel

MODEL = flags.DEFINE_string("model", None, "Checkpoint folder or cached model name.")
TEXT = flags.DEFINE_string("text", None, "The text to analyse.")
TEXT_FILE = flags.DEFINE_string("text_file", None, "A file holding the text.")
CORPUS = flags.DEFINE_string(
    "corpus", None, "A .txt (documents split by blank lines), a .jsonl ('text') or a folder."
)
TOKENS = flags.DEFINE_integer("tokens", None, "Window length for --corpus (tokens).")
MAX_WINDOWS = flags.DEFINE_integer("max_windows", None, "At most this many windows, in order.")
BATCH = flags.DEFINE_integer("batch_size", 8, "Windows per batch (--corpus).")
PRUNING = flags.DEFINE_bool("pruning", False, "Pruning curves of the loss (--corpus).")
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
SINK_TOKENS = flags.DEFINE_integer(
    "sink_tokens", 0, "Also measure the graph without the first k tokens (0: off)."
)


def spec() -> measures.AnalysisSpec:
    layers = None if LAYERS.value is None else tuple(int(x) for x in LAYERS.value)
    return measures.AnalysisSpec(
        horizon=HORIZON.value,
        max_steps=MAX_STEPS.value,
        residual=RESIDUAL.value,
        layers=layers,
        pairwise=PAIRWISE.value,
        optimal_weights=OPTIMAL.value,
        sink_tokens=SINK_TOKENS.value,
    )


def read_text_file(path: str) -> str:
    """The file's text; a missing, unreadable or non-UTF-8 file is a ValueError naming it."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(
            f"--text_file {path} is not UTF-8 text (byte {err.start}: {err.reason})"
        ) from err
    except OSError as err:
        raise ValueError(f"--text_file {path} cannot be read: {err.strerror}") from err


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    if bool(MODEL.value) == bool(ATTENTION.value):
        raise app.UsageError("give exactly one of --model or --attention")
    given = [f for f in (TEXT.value, TEXT_FILE.value, CORPUS.value) if f]
    if MODEL.value and len(given) != 1:
        raise app.UsageError("--model needs exactly one of --text, --text_file or --corpus")
    if CORPUS.value and TOKENS.value is None:
        raise app.UsageError("--corpus needs --tokens=T, the window length")
    try:
        mesh = None if MESH.value is None else parallel.mesh_from_flag(MESH.value)
        if ATTENTION.value:
            record = text_lib.attention_record(ATTENTION.value, spec())
        elif CORPUS.value:
            cspec = windows.CorpusSpec(
                tokens=TOKENS.value,
                max_windows=MAX_WINDOWS.value,
                batch_size=BATCH.value,
                pruning=PRUNING.value,
            )
            models = series.expand(MODEL.value)
            if len(models) > 1:
                _, written = series.run_corpus(
                    models, CORPUS.value, cspec, spec(), OUT.value, DTYPE.value, mesh=mesh
                )
                print(f"wrote {written}")
                return
            summary, _ = windows.run(
                models[0], CORPUS.value, cspec, spec(), OUT.value, DTYPE.value, mesh=mesh
            )
            for path in corpus_report.write(summary, OUT.value):
                print(f"wrote {path}")
            return
        else:
            text = TEXT.value if TEXT.value else read_text_file(TEXT_FILE.value)
            models = series.expand(MODEL.value)
            if len(models) > 1:
                _, written = series.run(models, text, spec(), OUT.value, DTYPE.value, mesh=mesh)
                print(f"wrote {written}")
                return
            record = text_lib.text_record(models[0], text, spec(), DTYPE.value, mesh)
    except (ValueError, FileNotFoundError, locks.FolderBusy) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    for path in text_report.write(record, OUT.value):
        print(f"wrote {path}")


if __name__ == "__main__":
    parallel.use_all_cpu_cores()
    app.run(main)
