"""The package's plan, read from its source with `ast`: imports flow one way (entry points
-> workflows -> reports -> models -> kernels -> base helpers), the two workflows never
import each other, no module reaches into another's private names, and modules stay
small."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PACKAGE = ROOT / "beyondpar"
# A folder sits in one layer unless one of its modules is named here on its own:
# head pruning's ranking of heads is a kernel, the rest of `pruning` runs models.
KERNELS = {"graphs", "metrics", "synergy", "weighting", "coalitions", "pruning.ranking"}
MODELS = {
    "model",
    "linear",
    "norm",
    "batches",
    "tasks",
    "checkpoints",
    "released",
    "pretrained",
    "pruning",
    "lm",
}
WORKFLOWS = {"study", "analysis"}
WORKFLOW_RANK = 5
MAX_FUNCTION_LINES = 60


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(name: str) -> tuple[int, str]:
    """(rank, group) of a beyondpar module; a module imports only ranks <= its own."""
    parts = name.split(".")[1:]
    pair = ".".join(parts[:2])
    top = pair if pair in KERNELS | MODELS else (parts[0] if parts else "")
    if top == "base":
        return 0, "base"
    if top in KERNELS:
        return 1, "kernels"
    if top == "measure":
        return 2, "measure"
    if top in MODELS:
        return 3, "models"
    if top == "reports":
        return 4, "reports"
    if top in WORKFLOWS:
        return WORKFLOW_RANK, top
    if top == "benchmarks":
        return 6, "benchmarks"
    return 7, "package"


def imports(tree: ast.AST, name: str) -> list[tuple[str, ast.AST]]:
    """(imported beyondpar module, node): `from beyondpar.x import y` counts as x.y when y
    is a module of the package, else as x."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node) for a in node.names if a.name.startswith("beyondpar")]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("beyondpar"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                is_module = (ROOT / Path(*full.split("."))).with_suffix(".py").exists() or (
                    ROOT / Path(*full.split("."))
                ).is_dir()
                found.append((full if is_module else node.module, node))
    return found


def sources():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, module_name(path), ast.parse(path.read_text())


def test_imports_flow_down_and_workflows_stay_apart():
    wrong = []
    for path, name, tree in sources():
        rank, group = layer(name)
        for target, node in imports(tree, name):
            t_rank, t_group = layer(target)
            if t_rank > rank or (t_rank == rank == WORKFLOW_RANK and t_group != group):
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} {name} -> {target}")
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_graphs_metrics_and_reports_import_only_base_helpers():
    """The kernels work on any attention array, and the report pieces on any numbers:
    both workflows use them, so they know nothing of models or records. graphs.py, every
    module of the metrics package and of reports: base helpers and their own package."""
    metrics = sorted((PACKAGE / "metrics").glob("*.py"))
    reports = sorted((PACKAGE / "reports").glob("*.py"))
    assert len(metrics) > 1 and len(reports) > 1, "metrics/ or reports/ holds no modules"
    for path in (PACKAGE / "graphs.py", *metrics, *reports):
        own = f"beyondpar.{path.parent.name}." if path.parent != PACKAGE else "beyondpar.base"
        targets = {t for t, _ in imports(ast.parse(path.read_text()), "")}
        assert all(t.startswith(("beyondpar.base", own)) for t in targets), (path.name, targets)


def test_no_function_imports_the_package():
    local = []
    for path, _, tree in sources():
        for func in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
            for node in ast.walk(func):
                if isinstance(node, ast.Import | ast.ImportFrom):
                    names = [getattr(node, "module", None) or ""] + [a.name for a in node.names]
                    if any(n.startswith("beyondpar") for n in names):
                        local.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not local, f"function-local imports of beyondpar: {local}"


def test_no_module_uses_another_modules_private_names():
    used = []
    for path, _, tree in sources():
        modules = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("beyondpar"):
                modules |= {a.asname or a.name for a in node.names}
                used += [
                    f"{path.relative_to(ROOT)}:{node.lineno} {a.name}"
                    for a in node.names
                    if a.name.startswith("_")
                ]
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in modules
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                used.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value.id}.{node.attr}")
    assert not used, f"private names of other modules: {used}"


def test_functions_are_short():
    long = []
    for path, _, tree in sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines})")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_folder_inits_only_reexport():
    for path in PACKAGE.rglob("__init__.py"):
        body = ast.parse(path.read_text()).body
        for node in body:
            docstring = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            version = isinstance(node, ast.Assign) and [t.id for t in node.targets] == [
                "__version__"
            ]
            assert docstring or version or isinstance(node, ast.Import | ast.ImportFrom), (
                f"{path.relative_to(ROOT)}:{node.lineno} holds logic"
            )


def test_top_level_is_small_and_has_no_prefixed_family():
    modules = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    assert len(modules) <= 12, modules
    prefixes = [m.split("_")[0] for m in modules if "_" in m]
    assert not [m for m in modules if m.split("_")[0] in prefixes and "_" in m], modules


@pytest.mark.parametrize("folder", ["configs", "launch"])
def test_configs_and_launchers_import_no_private_or_sibling_logic(folder):
    """Configs are data: they import config helpers, never a workflow; launchers only
    parse flags, so they need nothing private."""
    for path in sorted((ROOT / folder).glob("*.py")):
        targets = {t for t, _ in imports(ast.parse(path.read_text()), "")}
        if folder == "configs":
            workflows = {t for t in targets if layer(t)[0] >= WORKFLOW_RANK}
            assert workflows <= {"beyondpar.study.config_lib"}, (path.name, workflows)
        assert not any(t.rsplit(".", 1)[-1].startswith("_") for t in targets), path.name


def test_the_public_api_is_where_users_look():
    """The names DESIGN.md's public API lists, at their documented paths."""
    from beyondpar import (
        checkpoints,
        coalitions,
        graphs,
        measure,
        metrics,
        model,
        pretrained,
        pruning,
        synergy,
        tasks,
    )
    from beyondpar.lm import data as lm_data

    names = {
        graphs: "combine_heads head_importance dag_operator rollout rollout_sink sink_mass "
        "drop_sink_tokens uniform_causal",
        metrics: "sink_signal minimax_fidelity node_fidelity hitting_time tv_mixing_time "
        "spectral_mixing_time survival spectral_radius relaxation_time operator_metrics "
        "monte_carlo_hitting_time map_blocks",
        synergy: "amplification pairwise_synergy optimal_weights cross_head_share head_diversity",
        checkpoints: "import_reference load CheckpointError checksum",
        model: "apply_with_attention",
        pretrained: "load apply_with_attention layer_by_layer build",
        tasks: "make_examples ATTENTION_TASKS Examples",
        pruning: "gradient_importance fidelity_order attention_necessity ORDERS orders",
        measure: "measure_layer MeasureSpec baselines record",
        coalitions: "values shapley harsanyi interaction zeta mix_value_fn sampled_shapley "
        "shapley_values",
        lm_data: "load default_data_config check_vocab bits_per_byte TextData",
    }
    missing = [
        f"{m.__name__}.{n}" for m, ns in names.items() for n in ns.split() if not hasattr(m, n)
    ]
    assert not missing, missing
    assert pretrained.gguf_file.GgufFile.tokenizer


def test_test_files_have_unique_names():
    """Test folders hold no __init__.py, so pytest imports each test file by its base name:
    two files of one name in different folders stop the whole suite at collection."""
    names = [p.name for p in (ROOT / "tests").rglob("test_*.py")]
    assert not {n for n in names if names.count(n) > 1}


def test_test_files_share_code_through_helpers_not_each_other():
    """What two test files share lives in tests/helpers: a test file that imports another
    runs that file's module-level setup and breaks when it is renamed or moved."""
    stems = {p.stem for p in (ROOT / "tests").rglob("test_*.py")}
    found = []
    for path in (ROOT / "tests").rglob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            imported = isinstance(node, ast.ImportFrom) and node.module
            if imported and node.module.split(".")[-1] in stems:
                found.append(f"{path.relative_to(ROOT)} imports {node.module}")
    assert not found, found
