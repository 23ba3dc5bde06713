#!/usr/bin/env bash
# constraints-cpu.txt made anew: every package of the CPU install (README's `pip install -c constraints-cpu.txt -e
# '.[dev]'`, the pip that .ci/run upgrades to and the setuptools it builds the project with) pinned, for every Python
# the project takes (>= 3.10) and every platform, so that a new release of any of them cannot turn CI red on unchanged
# code; the gpu extra's packages too, for the GPU runners (gpu.yml installs with this file less the pins of the
# runner's CUDA torch and of what it requires: scripts/gpu_constraints.py). The weekly torch-upgrade job installs the
# newest of everything, without this file, and says what a bump would meet.
# uv's universal resolution writes one file with a pin per Python version where they differ (pip-tools resolves for
# the Python it runs under only). The file's pins are kept where they still fit (a new requirement gets the newest
# release that does, nothing else moves); --upgrade takes the newest of everything. Needs uv (`pip install uv`) and
# PyPI. To bump torch or Triton, edit its line in constraints-cpu.txt and run this.
# Usage: bash scripts/lock_cpu.sh [--upgrade]
set -euo pipefail
cd "$(dirname "$0")/.."
upgrade=()
case "${1:-}" in
  "") ;;
  --upgrade) upgrade=(--upgrade) ;;
  *) echo "lock_cpu: unknown argument $1: the one option is --upgrade" >&2; exit 2 ;;
esac
command -v uv > /dev/null || { echo "lock_cpu: needs uv on PATH (pip install uv)" >&2; exit 2; }
missing() { echo "lock_cpu: constraints-cpu.txt has no $1== line" >&2; exit 2; }
torch=$(grep -m1 '^torch==' constraints-cpu.txt) || missing torch
triton=$(grep -m1 '^triton==' constraints-cpu.txt) || missing triton
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "$torch" > "$work/torch.txt"
# beside the project's: pip, which .ci/run upgrades to, and the build backend, which it builds the project with
printf 'pip\nsetuptools\n' > "$work/tools.in"
# PyPI's torch is the CUDA build, which pins its own Triton and brings CUDA's packages; the CPU wheel that the install
# takes brings neither: the Triton here is the one liger-kernel brings, held at the pin below, and no CUDA package is
# written (nvidia-ml-py, NVML's Python bindings that the gpu extra asks for, is not one)
echo "$triton" > "$work/overrides.txt"
cp constraints-cpu.txt "$work/lock.txt"  # uv keeps the pins of the file it writes, unless --upgrade
uv pip compile pyproject.toml "$work/tools.in" --extra dev --extra gpu --universal --python-version 3.10 \
  --constraints "$work/torch.txt" --overrides "$work/overrides.txt" --no-annotate --no-header --quiet \
  "${upgrade[@]}" --output-file "$work/lock.txt"
{
  cat << 'EOF2'
# The CPU install's every package pinned: CI (.ci/run) and README install with it, so that a new release of a
# dependency cannot turn CI red on unchanged code; the GPU runners install with it less the pins of their own torch
# and of what it requires (gpu.yml, scripts/gpu_constraints.py). Written by `bash scripts/lock_cpu.sh` (uv's universal resolution: a pin per Python version where they
# differ); edit only the torch and triton lines by hand, then run it. The weekly torch-upgrade job installs the newest
# of everything without this file.
# torch: the CPU wheel (2.13.0+cpu satisfies ==2.13.0); unpinned, pip pulls the newest CUDA build (gigabytes).
# triton, which liger-kernel brings (the dev extra), runs its kernels in tests/test_kernels.py under its interpreter:
# 3.6 fails there under numpy 2.4 (a 1-element array made a Python int); 3.9 prints nanobind's leak report at the
# exit of every process that imported torch._dynamo. 3.8.0 does neither.
EOF2
  grep -v -P '^(nvidia-(?!ml-py\b)|cuda-)' "$work/lock.txt"
} > constraints-cpu.txt
echo "lock_cpu: constraints-cpu.txt: $(grep -c '==' constraints-cpu.txt) pins"
