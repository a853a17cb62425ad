"""What the tests share besides fixtures: paths of the test data, the released checkpoints
of the paper, the suite's compile settings, launchers run as a user would, and the Hugging
Face and GGUF fixtures. Tests import it by module (`from helpers.paths import DATA`);
pytest puts `tests/` on the path (`pythonpath` in pyproject.toml)."""
