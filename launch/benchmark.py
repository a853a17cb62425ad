"""Benchmarks that print ratios measured in one run.

python launch/benchmark.py metrics [--repeats 5]
python launch/benchmark.py train   [--repeats 5]
python launch/benchmark.py synergy [--repeats 1]     # one 16-head checkpoint, every analysis
python launch/benchmark.py pretrained [--repeats 1]  # GPT-2-small shape, 1,024 tokens
python launch/benchmark.py corpus                    # SmolLM2-135M shape, 100 x 512 tokens
python launch/benchmark.py load [--repeats 3]        # GGUF loading: Qwen2.5-0.5B shape, SmolLM2
"""

from absl import flags

from beyondpar import benchmarks
from beyondpar.base import cli, parallel

FLAGS = flags.DEFINE_integer("repeats", 5, "Timed repeats; the best one is reported.")


def main(argv):
    if len(argv) != 2 or argv[1] not in benchmarks.SUITES:
        raise ValueError(
            f"benchmark.py takes one suite, one of {list(benchmarks.SUITES)}, got {argv[1:]}"
        )
    benchmarks.SUITES[argv[1]](repeats=FLAGS.value)


if __name__ == "__main__":
    parallel.use_all_cpu_cores()
    cli.run(main)
