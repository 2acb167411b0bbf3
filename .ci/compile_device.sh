#!/usr/bin/env bash
# Compiles every device source for gfx90a (hipcc) and sm_90 (nvcc); prints what it checked.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
sources=$(git ls-files 'hip/*.hip' 'hip/kernels/*.hip')
for src in $sources; do
  base=$(basename "$src" .hip)
  HIP_PLATFORM=amd hipcc --offload-arch=gfx90a -std=c++17 -I. -c "$src" -o "$out/$base.amd.o"
  echo "compiled $src for gfx90a"
  if command -v nvcc >/dev/null 2>&1; then
    nvcc -std=c++17 -arch=sm_90 -I. -x cu -c "$src" -o "$out/$base.nv.o"
    echo "compiled $src for sm_90"
  else
    echo "nvcc not found: skipped the sm_90 compile of $src"
  fi
done
