"""setup.cfg: accelerator extras install the same jax the CPU default pins."""

import configparser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_accelerator_extras_pin_the_default_jax():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    requires = cfg["options"]["install_requires"].split()
    jax_range = next(r for r in requires if r.startswith("jax>=")).removeprefix("jax")
    extras = cfg["options.extras_require"]
    assert extras["cuda12"].split() == [f"jax[cuda12]{jax_range}"]
    assert extras["tpu"].split() == [f"jax[tpu]{jax_range}"]
    for name in ("safetensors", "tokenizers", "scipy"):
        assert any(r.startswith(f"{name}>=") for r in requires), name
    assert not any(r.startswith(("torch", "transformers")) for r in requires)


def test_the_report_pages_static_files_are_package_data():
    """index.html inlines reports/static/ from the installed package: every file there must
    be installed with it."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    patterns = [p.strip() for p in cfg["options.package_data"]["beyondpar.reports"].split(",")]
    static = ROOT / "beyondpar" / "reports"
    shipped = {p for pattern in patterns for p in static.glob(pattern)}
    assert set((static / "static").iterdir()) <= shipped
