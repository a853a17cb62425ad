"""The paper's Example 2: python launch/example2.py --out out/example2"""

import jax
from absl import flags

from beyondpar.base import cli
from beyondpar.study import worked_example

OUT = flags.DEFINE_string("out", "out/example2", "Folder for the PNGs and the JSON summary.")


def main(argv):
    del argv
    result = worked_example.write(OUT.value)
    print(worked_example.format_summary(result))
    print(f"figures and summary in {OUT.value}/")


if __name__ == "__main__":
    jax.config.update("jax_enable_x64", True)  # a worked example: exact to the last digit
    cli.run(main)
