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

# The CUDA build of the extension itself (FFI handlers, GPU communicators, bindings, runtime), in
# the quick kernel space: the host code that talks to the device must compile and link too.
if command -v nvcc >/dev/null 2>&1 && [ -x .venv/bin/pip ]; then
  JAX_RCCL_GPU=cuda JAX_RCCL_DEVICE_QUICK=ON .venv/bin/pip wheel -q --no-build-isolation --no-deps \
    -w "$out/wheel" . --config-settings=build-dir="$out/build-cuda"
  echo "built the CUDA extension (JAX_RCCL_DEVICE_QUICK=ON)"
  # The default build targets sm_90 (not nvcc's own default, which a GPU would have to JIT).
  if ! grep -q "sm_90" "$out/build-cuda/build.ninja" 2>/dev/null && \
     ! grep -rqs "sm_90" "$out/build-cuda/CMakeFiles"; then
    echo "the CUDA build does not target sm_90" >&2
    exit 1
  fi
  echo "the CUDA build targets sm_90"
else
  echo "nvcc or .venv not found: skipped the CUDA extension build"
fi
