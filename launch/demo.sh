#!/usr/bin/env bash
# The main job on a small CPU default: trains heads 1/4/8/16 x cycle/induction, two tasks that
# need attention (configs/ablation.py:tasks=demo on configs/cpu.py),
# evaluates every run (synergy analyses and pruning included), writes the report, the
# paper's Example 2 and the analysis of a text through a tiny GPT-2. Re-running resumes.
set -euo pipefail
source "$(dirname "$0")/setup_env.sh"
out="${OUT:-out}"
python launch/ablate.py --config=configs/ablation.py:tasks=demo --workdir="$out/ablation"
python launch/example2.py --out "$out/example2"
python launch/analyze.py --model=tests/data/hf/gpt2-tiny --out="$out/analysis" \
  --text="Multi-head attention lets every head of a layer read the earlier tokens in its own way"
echo
echo "report:    $out/ablation/report/report.md (+ results.csv, results.json, *.png)"
echo "records:   $out/ablation/evaluation.jsonl"
echo "example 2: $out/example2/"
echo "analysis:  $out/analysis/report.md (a tiny GPT-2 checkpoint on one text)"
