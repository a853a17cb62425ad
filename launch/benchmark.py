"""Benchmarks that print ratios measured in one run, a line per part as it finishes and
one JSON line at the end.

python launch/benchmark.py metrics      # kernels vs the paper, NumPy, matmul (5 repeats)
python launch/benchmark.py train        # train step per head count vs PyTorch (20 repeats)
python launch/benchmark.py synergy      # one 16-head checkpoint, every analysis (1 repeat)
python launch/benchmark.py pretrained   # GPT-2-small shape, 1,024 tokens (1 repeat)
python launch/benchmark.py corpus       # SmolLM2-135M shape, 100 x 512 tokens (one pass)
python launch/benchmark.py load         # GGUF loading: Qwen2.5-0.5B shape, SmolLM2 (3 repeats)
python launch/benchmark.py coalitions   # every coalition of heads: SmolLM2, 16-head (1 repeat)

--repeats=N overrides a suite's timed repeats (the best one is reported).
"""

from absl import flags

from beyondpar import benchmarks
from beyondpar.base import cli, parallel

FLAGS = flags.DEFINE_integer(
    "repeats",
    None,
    "Timed repeats, the best one reported; default: the suite's own (above).",
    lower_bound=1,
)


def main(argv):
    if len(argv) != 2 or argv[1] not in benchmarks.SUITES:
        raise ValueError(
            f"benchmark.py takes one suite, one of {list(benchmarks.SUITES)}, got {argv[1:]}"
        )
    kwargs = {} if FLAGS.value is None else {"repeats": FLAGS.value}
    benchmarks.SUITES[argv[1]](**kwargs)


if __name__ == "__main__":
    parallel.use_all_cpu_cores()
    cli.run(main, positional=True)
