"""The README and docs/ hold only what runs: every shell command names a launcher whose
flags parse or a script that exists, every Python block runs and prints what the page
shows after it, every relative link and every repository path in backticks leads to a
file, every package name in backticks (`metrics.survival`) exists, and the README's layout
tree is the package's."""

import contextlib
import importlib
import io
import math
import re
import shlex
import traceback
from pathlib import Path
from typing import NamedTuple

import launcher_flags

from beyondpar import benchmarks

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SCRIPT_RUNNERS = ("bash", "source", ".")
NUMBER = re.compile(r"[-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?")


class Block(NamedTuple):
    page: Path
    line: int
    lang: str
    text: str
    output: str | None  # the ```text block right after it: what it prints


def fenced_blocks(page: Path) -> list[Block]:
    """The page's fenced blocks in order; a ```text block that follows a code block with
    only blank lines between is that block's output, not a block of its own."""
    found, lines, i = [], page.read_text().splitlines(), 0
    while i < len(lines):
        if not lines[i].startswith("```"):
            i += 1
            continue
        start, lang = i, lines[i][3:].strip()
        i += 1
        while not lines[i].startswith("```"):
            i += 1
        text = "\n".join(lines[start + 1 : i]) + "\n"
        i += 1
        if lang == "text" and found and found[-1].output is None and found[-1].lang != "text":
            between = lines[found[-1].line + len(found[-1].text.splitlines()) + 1 : start]
            if not "".join(between).strip():
                found[-1] = found[-1]._replace(output=text)
                continue
        found.append(Block(page, start + 1, lang, text, None))
    return found


def blocks(lang: str) -> list[Block]:
    return [b for page in PAGES for b in fenced_blocks(page) if b.lang == lang]


def shell_commands() -> list[tuple[str, list[str]]]:
    """(where, words) of every command in the bash blocks: continuation lines joined,
    comments and leading VAR=value assignments dropped."""
    commands = []
    for block in blocks("bash"):
        for line in block.text.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
                words = words[1:]
            if words:
                where = f"{block.page.relative_to(ROOT)}:{block.line}"
                commands.append((where, words))
    return commands


def test_readme_opens_with_the_two_commands_and_stays_short():
    readme = ROOT / "README.md"
    first = fenced_blocks(readme)[0]
    assert [words for _, words in shell_commands()[:2]] == [
        ["./launch/demo.sh"],
        ["./launch/test.sh"],
    ]
    assert first.line <= 5 and first.text.count("\n") == 2
    assert len(readme.read_text().splitlines()) <= 220


def test_every_shell_command_is_a_launcher_or_a_script_that_exists():
    unknown = []
    for where, words in shell_commands():
        launcher = words[0] == "python" and re.fullmatch(r"launch/\w+\.py", words[1])
        if launcher or words[0] in SCRIPT_RUNNERS:
            script = words[1]
        elif words[0].startswith("./launch/"):
            script = words[0]
        else:
            unknown.append(f"{where} {shlex.join(words)}")
            continue
        if not (ROOT / script).is_file():
            unknown.append(f"{where} {script} does not exist")
    assert not unknown, "commands the docs show that no test runs:\n" + "\n".join(unknown)


def test_every_launcher_command_parses_with_the_launchers_flags():
    commands = [(w, words[1:]) for w, words in shell_commands() if words[0] == "python"]
    results = launcher_flags.parse([argv for _, argv in commands])
    wrong = []
    for (where, argv), (message, rest) in zip(commands, results, strict=True):
        takes = [list(benchmarks.SUITES)] if argv[0] == "launch/benchmark.py" else []
        if (
            message != "ok"
            or len(rest) != len(takes)
            or any(word not in allowed for word, allowed in zip(rest, takes, strict=True))
        ):
            wrong.append(f"{where} {shlex.join(argv)}: {message}, arguments {rest}")
    assert not wrong, "\n".join(wrong)


def run_block(code: str) -> str:
    """What `code` printed (or its traceback), run in a fresh namespace of this process as
    a script's `__main__`: the libraries it imports are loaded once for every block."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            exec(compile(code, "<doc block>", "exec"), {"__name__": "__main__"})
        except Exception:
            print(traceback.format_exc())
    return out.getvalue()


def same_output(shown: str, printed: str) -> bool:
    """The text the same but for spacing, the numbers within float32 rounding."""
    if re.sub(r"\s", "", NUMBER.sub("#", shown)) != re.sub(r"\s", "", NUMBER.sub("#", printed)):
        return False
    pairs = zip(NUMBER.findall(shown), NUMBER.findall(printed), strict=True)
    return all(math.isclose(float(a), float(b), rel_tol=1e-4, abs_tol=1e-6) for a, b in pairs)


def test_python_blocks_run_and_print_what_the_docs_show(monkeypatch):
    """From the repository root, as the pages' relative paths assume."""
    monkeypatch.chdir(ROOT)
    wrong = []
    for block in blocks("python"):
        printed = run_block(block.text)
        where = f"{block.page.relative_to(ROOT)}:{block.line}"
        if "Traceback (most recent call last)" in printed:
            wrong.append(f"{where} fails:\n{printed}")
        elif block.output is not None and not same_output(block.output, printed):
            wrong.append(f"{where} prints\n{printed}the page shows\n{block.output}")
    assert not wrong, "\n".join(wrong)


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of the page's headings."""
    heads = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", page.read_text(), flags=re.S), re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


def test_relative_links_lead_to_files_and_headings():
    broken = []
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists() or (anchor and anchor not in anchors(file)):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken


def test_repository_paths_in_backticks_exist():
    """`launch/x.py`, `configs/x.py:args`, `tests/data/...`: a renamed file shows here."""
    missing = []
    for page in PAGES:
        for code in re.findall(r"`([^`\s]+)`", page.read_text()):
            path = code.split(":")[0]
            repository = re.fullmatch(r"(beyondpar|launch|configs|tests|data|docs)/[\w./-]*", path)
            if repository and not (ROOT / path).exists():
                missing.append(f"{page.relative_to(ROOT)}: {code}")
    assert not missing, missing


def test_the_readme_layout_tree_is_the_package():
    readme = (ROOT / "README.md").read_text()
    tree = readme.split("## Layout", 1)[1].split("```")[1]
    named = set(re.findall(r"^  (\w+(?:\.py|/))", tree, re.M))
    package = {
        p.name + ("/" if p.is_dir() else "")
        for p in (ROOT / "beyondpar").iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()
    }
    assert named == package
    top = set(re.findall(r"^(\w+)/", tree, re.M))
    assert all((ROOT / folder).is_dir() for folder in top), top


FILE_SUFFIXES = {"py", "json", "jsonl", "md", "npz", "pt", "gguf", "txt", "safetensors"}
GGUF_METADATA = ("tokenizer.ggml.", "general.")


def package_modules() -> dict[str, list[str]]:
    """Short name -> dotted names of the package's modules (`files`: base and pretrained)."""
    found: dict[str, list[str]] = {}
    for path in (ROOT / "beyondpar").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        for short in {parts[-1], ".".join(parts)}:
            found.setdefault(short, []).append(".".join(parts))
    return found


def resolves(dotted: str, modules: dict[str, list[str]]) -> bool:
    """Whether `module.name...` (a module's short or full name first) is an attribute
    chain of one of the modules that name fits."""
    for cut in range(dotted.count(".") + 1, 0, -1):
        head, rest = ".".join(dotted.split(".")[:cut]), dotted.split(".")[cut:]
        for candidate in modules.get(head, []):
            value = importlib.import_module(candidate)
            for name in rest:
                value = getattr(value, name, None)
            if value is not None:
                return True
    return False


def test_package_names_in_backticks_exist():
    """`metrics.survival`, `beyondpar.base.parallel.use_all_cpu_cores`, `sharding.SPLITS`:
    a renamed module or function shows here."""
    modules, missing = package_modules(), []
    for page in PAGES:
        for code in set(re.findall(r"`((?:\w+\.)+\w+)", page.read_text())):
            first, last = code.split(".")[0], code.split(".")[-1]
            metadata = code.startswith(GGUF_METADATA)  # a GGUF key, not a module
            named = first in modules and last not in FILE_SUFFIXES and not metadata
            if named and not resolves(code, modules):
                missing.append(f"{page.relative_to(ROOT)}: {code}")
    assert not missing, missing


def test_the_design_lists_every_field_of_the_per_layer_record_with_its_unit():
    """The record's table in docs/design.md is the record: a field added, renamed or
    given another unit in measure.record shows here."""
    from beyondpar.measure import record

    text = (ROOT / "docs" / "design.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| (\w+) \|", text, re.MULTILINE))
    want = {f.name: f.unit for f in record.FIELDS.values()}
    assert {name: rows.get(name) for name in want} == want
