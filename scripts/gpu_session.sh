#!/usr/bin/env bash
# Everything the GPU issue needs from a GPU machine, in as few calls as possible. Tables, logs and JSON go to
# one output folder. Stages (each fits a 10-minute call; `all` runs them in order):
#   record   device facts, measured matmul peak, the whole GPU tier once with --update-baselines (wall time)
#   verify   the whole GPU tier again against the baselines just written: a false failure shows here
#   profile  the top ladder rung under torch.profiler, and the report tables of the verify run
#   converge the GPU convergence tier with --update-baselines: the char-shape study at 5,000 steps (about 1-2
#            minutes a case on an H100: split it over calls with CONVERGE_K, e.g. CONVERGE_K=char-ctx2), then the
#            memory recipes' quality on real text (not part of `all`)
#   budget   why a compile memory budget runs out of memory (not part of `all`): the partitioner's plan for
#            deep-1.6b on CUDA (compile, budget-0.60, budget-0.05), then the allocator history of budget-0.05 and
#            budget-0.60 over 3 steps, each summarized by the lines that allocated what was live at the peak
# Usage: bash scripts/gpu_session.sh STAGE [OUT_DIR]   (OUT_DIR defaults to $OUT, else out/gpu)
set -uo pipefail
stage=${1:?stage: record, verify, profile, converge, budget or all}
out=${2:-${OUT:-out/gpu}}
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/gptcore-inductor}
python -m pip install --quiet --no-deps --no-build-isolation -e . >/dev/null 2>&1 || export PYTHONPATH=$PWD

record() {
  { nvidia-smi; python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"; } >"$out/env.txt" 2>&1
  python scripts/matmul_peak.py --dtype bf16 --json "$out/matmul-bf16.json"
  start=$(date +%s)
  pytest bench -m gpu --require-gpu --update-baselines --benchmark-json "$out/record.json" 2>&1 | tee "$out/record.log"
  echo "GPU tier wall time (record): $(( $(date +%s) - start )) s" | tee -a "$out/record.log"
  cp baselines/nvidia-*.json "$out/" 2>/dev/null
}

verify() {
  start=$(date +%s)
  pytest bench -m gpu --require-gpu --benchmark-json "$out/verify.json" 2>&1 | tee "$out/verify.log"
  echo "GPU tier wall time (verify): $(( $(date +%s) - start )) s" | tee -a "$out/verify.log"
}

profile() {
  python scripts/profile_step.py --model gpt2 --recipe ladder-8 --out "$out" 2>&1 | tail -60
  for run in verify record; do
    if [ -f "$out/$run.json" ]; then python -m gptcore report "$out/$run.json" >"$out/report.txt" 2>&1; break; fi
  done
}

converge() {
  start=$(date +%s)
  pytest bench/test_convergence_char_shape.py bench/test_convergence_memory_recipes.py --require-gpu \
    --update-baselines -k "${CONVERGE_K:-convergence}" --benchmark-json "$out/converge.json" 2>&1 | tee "$out/converge.log"
  echo "convergence tier wall time: $(( $(date +%s) - start )) s" | tee -a "$out/converge.log"
  cp baselines/nvidia-*.json "$out/" 2>/dev/null
}

budget() {
  start=$(date +%s)
  python scripts/partition_memory.py --model deep-1.6b --device cuda --json "$out/partition-deep-1.6b.json" 2>&1 \
    | tee "$out/budget.log"
  for recipe in budget-0.05 budget-0.60; do
    python scripts/memory_snapshot.py --model deep-1.6b --recipe "$recipe" --out "$out" 2>&1 | tee -a "$out/budget.log"
  done
  echo "budget stage wall time: $(( $(date +%s) - start )) s" | tee -a "$out/budget.log"
}

case "$stage" in
  budget) budget ;;
  converge) converge ;;
  record) record ;;
  verify) verify ;;
  profile) profile ;;
  all) record; verify; profile ;;
  *) echo "unknown stage $stage: record, verify, profile, converge, budget or all" >&2; exit 2 ;;
esac
