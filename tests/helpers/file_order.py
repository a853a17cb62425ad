"""The order in which test files start: the longest first, so that the two test processes
end together (pytest-xdist hands out whole files, `--dist loadfile`, in collection order
under `--no-loadscope-reorder`; its own order, by test count, left a process with a long
file when the other had finished)."""

from pathlib import Path

# Seconds a file took in its process in a suite run on 2 cores (`./launch/test.sh`), for the
# files of 6 s or more; the other files follow in collection order.
LONG_FILES = {
    "tests/study/test_train.py": 69,
    "tests/test_metrics.py": 58,
    "tests/study/test_workdir.py": 49,
    "tests/benchmarks/test_benchmarks.py": 41,
    "tests/test_weighting.py": 40,
    "tests/study/test_evaluate.py": 35,
    "tests/analysis/test_corpus.py": 33,
    "tests/test_model.py": 32,
    "tests/pretrained/test_loading.py": 28,
    "tests/lm/test_lm_train.py": 26,
    "tests/reports/test_html_browser.py": 25,
    "tests/analysis/test_text.py": 22,
    "tests/test_synergy.py": 22,
    "tests/pretrained/test_sharding.py": 19,
    "tests/measure/test_layer.py": 17,
    "tests/lm/test_lm_train_processes.py": 16,
    "tests/pruning/test_coalition_loss.py": 16,
    "tests/analysis/test_text_options.py": 16,
    "tests/study/test_pruning_curves.py": 15,
    "tests/lm/test_lm_train_behaviour.py": 14,
    "tests/pretrained/test_gguf_reader.py": 13,
    "tests/test_code_generation.py": 13,
    "tests/lm/test_lm_report_ablation.py": 12,
    "tests/test_docs.py": 12,
    "tests/pretrained/test_real_model.py": 12,
    "tests/analysis/test_coalition_summary.py": 12,
    "tests/test_pruning.py": 12,
    "tests/test_launchers_study.py": 11,
    "tests/pretrained/test_running.py": 11,
    "tests/test_test_workers.py": 11,
    "tests/lm/test_lm_train_sizes.py": 11,
    "tests/study/test_ablation.py": 10,
    "tests/pretrained/test_gemma.py": 9,
    "tests/analysis/test_text_report.py": 9,
    "tests/study/test_train_memory.py": 8,
    "tests/test_launch.py": 7,
    "tests/test_launchers.py": 7,
    "tests/test_checkpoints.py": 7,
    "tests/benchmarks/test_coalitions_benchmark.py": 7,
    "tests/study/test_coalition_record.py": 7,
    "tests/pretrained/test_llama.py": 7,
    "tests/coalitions/test_mix_game.py": 7,
    "tests/study/test_attention_view.py": 6,
    "tests/coalitions/test_game_properties.py": 6,
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
