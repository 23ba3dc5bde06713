#!/usr/bin/env bash
# A GPU run in stages, for a time-limited or preemptible job: a Slurm allocation with --time, a spot instance, a CI
# job with a timeout (gptcore/gate/stages.py says what each stage runs). Every pytest stage runs with a deadline when
# the job has a limit (no case starts that would end after it), writes a results log line and its baseline entry the
# moment each case ends, and resumes from OUT_DIR/STAGE.jsonl when an earlier job left it there: a job killed at its
# limit, or preempted, costs only the case it was in.
#   plan         on CPU, no GPU: every stage's cases with a planned time (cut into jobs under --time-limit): the times
#                baselines/SLUG.json recorded with --device SLUG, else an H100's assumed from each case's FLOPs
#   smoke        one case of each kind, in order, stopping at the first failure (3 minutes at most)
#   ladder       GPT-2 124M up the ladder, recorded            memory   deep-1.6b x the 11 memory recipes, recorded
#   char         the char-shape study, recorded                convergence  the convergence tier's shorter runs
#   verify       the GPU tier's recorded cases again: a false failure shows here; then the GPU noise (noise.json)
#   budget       why a compile memory budget runs out of memory: the partitioner's plan, the allocator's history
#   profile      device facts, the bf16 matmul peak, ladder-8 under torch.profiler, the report
# Usage: bash scripts/gpu_session.sh STAGE[,STAGE...] [OUT_DIR] [--time-limit SECONDS] [--resume-from DIR]
#          [--pack FILE] [-k EXPR] [--device SLUG (plan)]
#   OUT_DIR        where everything is written as it ends (default $OUT, else out/gpu)
#   --time-limit   the job's seconds, e.g. 3600 for Slurm's --time=1:00:00 (default $GPTCORE_TIME_LIMIT; none: no
#                  job-wide deadline); stages named together run one after another and share it: no stage or case
#                  starts that would end after $GPTCORE_JOB_END (the job's start + the limit - 60 s, unless given)
#   --resume-from  a folder of an earlier job's STAGE.jsonl logs, where OUT_DIR starts empty on each job
#   --pack FILE    OUT_DIR as one .tar.gz, rewritten every 15 s and at the end (replaced whole, never half
#                  written), for a job that can hand back only a file or a few: a kill keeps the last 15 s; at the
#                  end the inductor cache too, beside FILE (below)
# The inductor cache travels between jobs on machines that start bare: with --pack, a job that ends (not one killed)
# writes its cache beside FILE, without Triton's binaries, as inductor.tar.gz.part-00, -01, ... of 15 MiB each (a
# lent GPU machine hands back files of 16 MiB at most), none where it is over $GPTCORE_CACHE_MAX_BYTES (45 MiB: a
# carried tree holds 64 MiB, the checkout and the wheels about 9 of them). Parts found in .inductor/
# ($GPTCORE_INDUCTOR_CARRY) are unpacked into an empty $TORCHINDUCTOR_CACHE_DIR before the first stage.
#   -k EXPR        the pytest stages run (and plan) only the cases EXPR matches (pytest's -k; and-ed with a stage's
#                  own), e.g. `memory,verify -k budget`: record the memory recipes left out, then the budgets again
# A failed smoke stops the rest.
set -uo pipefail
stages=${1:?stage: plan, smoke, ladder, memory, char, convergence, verify, budget or profile (several: smoke,ladder)}
shift
out=${OUT:-out/gpu}
limit=${GPTCORE_TIME_LIMIT:-}
resume_from=""
device=""
pack=""
select=""
while [ $# -gt 0 ]; do
  case "$1" in
    --time-limit) limit=${2:?--time-limit: seconds}; shift 2 ;;
    --time-limit=*) limit=${1#*=}; shift ;;
    --resume-from) resume_from=${2:?--resume-from: a folder}; shift 2 ;;
    --resume-from=*) resume_from=${1#*=}; shift ;;
    --device) device=${2:?--device: a baselines file stem, e.g. nvidia-h200}; shift 2 ;;
    --device=*) device=${1#*=}; shift ;;
    --pack) pack=${2:?--pack: a file for the .tar.gz}; shift 2 ;;
    --pack=*) pack=${1#*=}; shift ;;
    -k) select=${2:?-k: a pytest -k expression}; shift 2 ;;
    -*) echo "unknown option $1: --time-limit SECONDS, --resume-from DIR, --pack FILE, -k EXPR, --device SLUG (plan)" >&2
      exit 2 ;;
    *) out=$1; shift ;;
  esac
done
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
py=${PYTHON:-$(command -v python3 || command -v python)}  # the GPU image's torch is its python3's
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/gptcore-inductor}
known=" plan smoke ladder memory char convergence verify budget profile "
for stage in ${stages//,/ }; do
  if [[ "$known" != *" $stage "* ]]; then
    echo "unknown stage $stage: plan, smoke, ladder, memory, char, convergence, verify, budget or profile" >&2
    exit 2
  fi
done
if [ "$stages" != plan ] && [ -e "$out" ] && [ ! -d "$out" ]; then
  echo "gpu_session.sh: OUT_DIR $out: a file; give a folder" >&2
  exit 2
fi
# the stages' dependencies first: one line naming what is missing, never a Python traceback (not ruptures: only
# `gptcore history` imports it, and the GPU image has none)
missing=$("$py" -c 'import importlib.util as u
print(" ".join(m for m in ("torch", "numpy", "tabulate", "pytest", "pytest_benchmark") if not u.find_spec(m)))' \
  2>/dev/null) || missing="everything (it did not run)"
if [[ -n "$missing" ]]; then
  echo "gpu_session.sh: $py lacks $missing: install the project into it first (pip install -e '.[dev,gpu]'," \
    "after the CUDA torch), or name another interpreter with PYTHON=" >&2
  exit 2
fi
if [ -z "${GPTCORE_JOB_END:-}" ]; then
  GPTCORE_JOB_END=$("$py" scripts/gpu_stage.py job-end ${limit:+--time-limit "$limit"}) || exit 2
fi
export GPTCORE_JOB_END

carry=${GPTCORE_INDUCTOR_CARRY:-.inductor}
unpack_cache() {  # a carried cache into an empty one (a warm machine's own is newer)
  compgen -G "$carry/inductor.tar.gz.part-*" >/dev/null || return 0
  [ -z "$(ls -A "$TORCHINDUCTOR_CACHE_DIR" 2>/dev/null)" ] || return 0
  mkdir -p "$TORCHINDUCTOR_CACHE_DIR" && cat "$carry"/inductor.tar.gz.part-* | tar xzf - -C "$TORCHINDUCTOR_CACHE_DIR" &&
    echo "inductor cache: unpacked $carry/inductor.tar.gz.part-* into $TORCHINDUCTOR_CACHE_DIR"
}

pack_cache() {  # the cache beside the archive, in parts; none where it is missing or too large to travel back
  [ -d "$TORCHINDUCTOR_CACHE_DIR" ] || return 0
  local dir whole size max=${GPTCORE_CACHE_MAX_BYTES:-47185920}
  dir=$(dirname "$pack")
  whole=$dir/inductor.tar.gz
  rm -f "$whole".part-*
  tar czf "$whole" --exclude=./triton -C "$TORCHINDUCTOR_CACHE_DIR" . 2>/dev/null
  [ $? -le 1 ] || { rm -f "$whole"; return 0; }
  size=$(stat -c %s "$whole")
  if [ "$size" -gt "$max" ]; then
    echo "inductor cache: $size B packed, over $max: not handed back" >&2
  else
    split -b 15M -d "$whole" "$whole.part-" && echo "inductor cache: $size B in $(ls "$whole".part-* | wc -l) part(s) in $dir"
  fi
  rm -f "$whole"
}

setup() {  # gptcore from this checkout, for the scripts too (the GPU image has every dependency but the gpu extra's)
  mkdir -p "$out"
  [[ ":${PYTHONPATH:-}:" == *":$PWD:"* ]] || export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
  wheels
}

wheels() {  # the gpu extra's packages (liger-kernel, torchao) from the wheels in .whl/, brought along where the GPU
  # machine reaches no registry (docs/gpu.md downloads them); installed once into .whl/site, no dependencies (the
  # image's torch and triton are theirs). Without wheels or with the packages present: nothing to do; a rung whose
  # package is still missing skips with the reason
  local site=$PWD/.whl/site
  if compgen -G ".whl/*.whl" >/dev/null \
    && ! "$py" -c 'import importlib.util as u, sys; sys.exit(not (u.find_spec("liger_kernel") and u.find_spec("torchao")))'; then
    # torchao's wheel ships its own test suite as a top-level package named `test`, which on PYTHONPATH would shadow
    # the standard library's: removed once installed
    [ -d "$site" ] || { "$py" -m pip install --quiet --no-deps --no-index --target "$site" .whl/*.whl && rm -rf "$site/test"; } \
      || echo "gpu_session.sh: the wheels in .whl/ did not install; the rungs that need them will skip" >&2
  fi
  if [ -d "$site" ] && [[ ":${PYTHONPATH:-}:" != *":$site:"* ]]; then export PYTHONPATH=$PYTHONPATH:$site; fi
}

needs_cuda() {  # the two script stages measure the GPU: without one, one line and a failed stage (not a CPU run)
  "$py" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null && return 0
  echo "gpu_session.sh: stage $1 needs CUDA, and $py sees none" >&2
  return 2
}

budget() {  # fails where any of its scripts failed (the status of a pipe into tee is tee's)
  local start status=0
  start=$(date +%s)
  needs_cuda budget || return
  "$py" scripts/partition_memory.py --model deep-1.6b --device cuda --json "$out/partition-deep-1.6b.json" 2>&1 \
    | tee "$out/budget.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  for recipe in budget-0.05 budget-0.60; do
    "$py" scripts/memory_snapshot.py --model deep-1.6b --recipe "$recipe" --out "$out" 2>&1 | tee -a "$out/budget.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  done
  echo "budget stage wall time: $(( $(date +%s) - start )) s" | tee -a "$out/budget.log"
  return "$status"
}

noise() {  # after verify: what the figures differ by between the recording runs and verify (scripts/gpu_noise.py)
  local logs=() name dir device
  for name in ladder memory char convergence; do
    for dir in "$out" ${resume_from:+"$resume_from"}; do
      if [ -f "$dir/$name.jsonl" ]; then logs+=("$dir/$name.jsonl"); break; fi
    done
  done
  if [ "${#logs[@]}" -eq 0 ] || [ ! -f "$out/verify.jsonl" ]; then
    echo "noise: no recording run's log in $out${resume_from:+ or $resume_from} beside verify.jsonl: nothing to compare"
    return 0
  fi
  device=$("$py" -c "import torch; print(torch.cuda.get_device_name(), 'torch', torch.__version__)" 2>/dev/null)
  "$py" scripts/gpu_noise.py "${logs[@]}" --against "$out/verify.jsonl" --json "$out/noise.json" --device "$device"
}

profile() {
  local status=0
  needs_cuda profile || return
  { nvidia-smi
    "$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
  } >"$out/env.txt" 2>&1
  "$py" scripts/matmul_peak.py --dtype bf16 --device cuda --json "$out/matmul-bf16.json" || status=1
  "$py" scripts/profile_step.py --model gpt2 --recipe ladder-8 --device cuda --out "$out" 2>&1 | tail -60
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  for run in verify ladder memory char; do
    if [ -f "$out/$run.json" ]; then "$py" -m gptcore report "$out/$run.json" >"$out/report.txt" 2>&1; break; fi
  done
  return "$status"
}

pack_now() {  # OUT_DIR into the archive: written beside it, then renamed over it. tar's exit 1 is "a file changed
  # as it was read" (a log being appended): the archive holds it as read, and stands
  mkdir -p "$out" || return
  tar czf "$pack.part" --exclude="./$(basename "$pack")*" --exclude="./inductor.tar.gz*" -C "$out" . 2>/dev/null
  [ $? -le 1 ] && mv -f "$pack.part" "$pack"
}
if [ -n "$pack" ] && [ "$stages" != plan ]; then
  mkdir -p "$(dirname "$pack")" && pack=$(cd "$(dirname "$pack")" && pwd)/$(basename "$pack") || exit 2
  rm -f "$pack.stop"
  # the packer stops at the next second once asked, never in the middle of a pack (a killed packer left its tar
  # writing beside the last pack, which then failed)
  every=${GPTCORE_PACK_EVERY:-15}  # seconds between packs (a test packs every second)
  ( n=0; while [ ! -e "$pack.stop" ]; do sleep 1; n=$((n + 1)); if [ "$n" -ge "$every" ]; then n=0; pack_now; fi; done ) &
  packer=$!
  trap 'touch "$pack.stop"; wait "$packer"; rm -f "$pack.stop"; pack_now; pack_cache' EXIT
  trap 'exit 143' TERM
fi

rc=0
[ "$stages" = plan ] || unpack_cache
for stage in ${stages//,/ }; do
  case "$stage" in
    plan) "$py" scripts/gpu_stage.py plan ${limit:+--time-limit "$limit"} ${device:+--device "$device"} \
        ${select:+-k "$select"} ;;
    smoke|ladder|memory|char|convergence|verify)
      setup
      "$py" scripts/gpu_stage.py run "$stage" --out "$out" ${resume_from:+--resume "$resume_from/$stage.jsonl"} \
        ${select:+-k "$select"} ;;
    budget|profile) if "$py" scripts/gpu_stage.py fits "$stage"; then setup; "$stage"; fi ;;
  esac
  code=$?
  if [ "$stage" = verify ]; then noise; fi
  if [ "$code" -ne 0 ]; then
    rc=$code
    if [ "$stage" = smoke ]; then echo "smoke failed (exit $code): the stages after it are not run" >&2; break; fi
  fi
done
exit "$rc"
