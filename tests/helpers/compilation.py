"""The suite's compile settings.

Most tests run small programs once, so compiling them takes longer than running them.
Code-generation settings, not numerical ones (no fast-math), compile faster and run
these sizes as fast: a lighter LLVM pipeline; each program's code as one LLVM module
(XLA cuts it into parts compiled on parallel threads, which on two cores shared by two
test processes only adds each part's own passes and memory maps: whole, the test
processes hold half as many maps and spend 10% less CPU time); and (before jaxlib 0.11)
XLA's elemental emitter for fusions in place of its MLIR emitters, which build a new MLIR
context with every dialect for each program. `test_code_generation.py` checks that the
paper's model gives the same numbers with XLA's defaults."""

import importlib.metadata


def quick_compile_flags(jaxlib_version: str) -> str:
    """The quick code-generation flags that `jaxlib_version`'s XLA knows. XLA stops the
    process at a flag it does not know, and jaxlib 0.11 no longer has the emitter switch
    (its fusion emitters are the only ones)."""
    flags = (
        "--xla_backend_optimization_level=1 --xla_llvm_disable_expensive_passes=true"
        " --xla_cpu_parallel_codegen_split_count=1"
    )
    major_minor = tuple(int(part) for part in jaxlib_version.split(".")[:2])
    return flags + (" --xla_cpu_use_fusion_emitters=false" if major_minor < (0, 11) else "")


QUICK_COMPILE = quick_compile_flags(importlib.metadata.version("jaxlib"))


def with_flags(xla_flags: str, flags: str) -> str:
    """`xla_flags` with each of `flags` added that it does not already set (a flag the
    user's XLA_FLAGS sets is left as the user set it)."""
    for flag in flags.split():
        if flag.split("=")[0] not in xla_flags:
            xla_flags = f"{xla_flags} {flag}".strip()
    return xla_flags
