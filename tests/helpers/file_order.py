"""The order in which test files start: the longest first, so that the two test processes
end together (pytest-xdist hands out whole files, `--dist loadfile`, in collection order
under `--no-loadscope-reorder`; its own order, by test count, left a process with a long
file when the other had finished)."""

from pathlib import Path

# Seconds a file took in its process in a suite run on 2 cores (`./launch/test.sh`), for the
# files of 6 s or more; the other files follow in collection order.
LONG_FILES = {
    "tests/test_metrics.py": 65,
    "tests/study/test_train.py": 63,
    "tests/study/test_workdir.py": 60,
    "tests/benchmarks/test_benchmarks.py": 56,
    "tests/study/test_evaluate.py": 52,
    "tests/test_weighting.py": 44,
    "tests/analysis/test_corpus.py": 40,
    "tests/test_model.py": 40,
    "tests/reports/test_html_browser.py": 35,
    "tests/analysis/test_text.py": 28,
    "tests/lm/test_lm_train.py": 26,
    "tests/test_synergy.py": 23,
    "tests/pretrained/test_sharding.py": 23,
    "tests/pretrained/test_loading.py": 21,
    "tests/test_code_generation.py": 21,
    "tests/measure/test_layer.py": 18,
    "tests/lm/test_lm_train_processes.py": 17,
    "tests/test_docs.py": 16,
    "tests/pretrained/test_gguf_reader.py": 15,
    "tests/study/test_pruning_curves.py": 15,
    "tests/analysis/test_text_options.py": 15,
    "tests/study/test_ablation.py": 14,
    "tests/pretrained/test_gemma.py": 12,
    "tests/pruning/test_coalition_loss.py": 12,
    "tests/pretrained/test_real_model.py": 12,
    "tests/lm/test_lm_train_behaviour.py": 12,
    "tests/test_launchers_study.py": 11,
    "tests/test_pruning.py": 11,
    "tests/pretrained/test_running.py": 11,
    "tests/analysis/test_coalition_summary.py": 10,
    "tests/lm/test_lm_report_ablation.py": 9,
    "tests/analysis/test_text_report.py": 9,
    "tests/lm/test_lm_train_sizes.py": 9,
    "tests/study/test_attention_view.py": 8,
    "tests/study/test_train_memory.py": 8,
    "tests/measure/test_coalition_game.py": 8,
    "tests/coalitions/test_mix_game.py": 8,
    "tests/test_launchers.py": 7,
    "tests/test_launch.py": 7,
    "tests/study/test_coalition_record.py": 7,
    "tests/pretrained/test_llama.py": 6,
    "tests/test_checkpoints.py": 6,
}


def file_of(item) -> str:
    """The file of a collected test, as `LONG_FILES` names it (from the root folder)."""
    return item.nodeid.split("::")[0]


def longest_first(items, seconds: dict[str, float] = LONG_FILES) -> None:
    """Sort `items` in place: the files of `seconds`, longest first, then the others, each
    file's tests and the other files in the order they were collected."""
    rank = {name: i for i, name in enumerate(sorted(seconds, key=seconds.get, reverse=True))}
    items.sort(key=lambda item: rank.get(file_of(item), len(rank)))


def missing_files(root: Path, seconds: dict[str, float] = LONG_FILES) -> list[str]:
    """The files of `seconds` that are not under `root` (a renamed file loses its place)."""
    return [name for name in seconds if not (root / name).is_file()]
