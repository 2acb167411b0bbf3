#!/usr/bin/env bash
# Compiles every device source once per architecture and prints what it checked, with times:
# - gfx90a: each hip/*.hip and every kernel unit hip/gen_kernels.py writes (all element types)
#   through hipcc (Debian's), JOBS at a time, at -O1: the whole front end and the backend's
#   instruction selection and code generation run (-O0 cannot select some of the cross-lane
#   intrinsics the kernels use), a third faster than the default -O3 (CI's time budget);
# - sm_90: the CUDA build of the extension (every device source, the FFI handlers, the GPU
#   communicators, the bindings and the runtime, linked), JOBS compiles at a time. It compiles
#   each device source once, so no separate per-file nvcc pass repeats them; the script checks
#   that every device source has its object in that build.
# JOBS defaults to the number of cores.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${JOBS:-$(nproc)}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# The kernel units, generated as the build generates them (every element type).
gen="$out/gen"
units=$(python3 hip/gen_kernels.py --out "$gen")
# One source per line (xargs -I takes whole lines).
sources=$(printf '%s\n' $(git ls-files 'hip/*.hip') $units)
started=$SECONDS

# One gfx90a compile: its own log, printed when it fails.
amd_compile() {
  local src=$1 out=$2 base
  base=$(echo "${src#"$out"/}" | tr / _)
  if ! HIP_PLATFORM=amd hipcc --offload-arch=gfx90a -std=c++17 -O1 -I. -I"$out/gen" -c "$src" \
       -o "$out/$base.amd.o" >"$out/$base.amd.log" 2>&1; then
    cat "$out/$base.amd.log" >&2
    echo "FAILED: $src for gfx90a" >&2
    return 1
  fi
  echo "compiled $src for gfx90a in $SECONDS s"  # SECONDS: this shell's own
}
export -f amd_compile

if command -v hipcc >/dev/null 2>&1; then
  echo "$sources" | xargs -r -P "$jobs" -I{} bash -c 'amd_compile "$1" "$2"' _ {} "$out"
  echo "gfx90a: $(echo "$sources" | wc -w) device sources in $((SECONDS - started)) s ($jobs jobs)"
else
  echo "hipcc not found: skipped the gfx90a compile" >&2
fi

if command -v nvcc >/dev/null 2>&1 && [ -x .venv/bin/pip ]; then
  t0=$SECONDS
  JAX_RCCL_GPU=cuda JAX_RCCL_DEVICE_QUICK=OFF JAX_RCCL_DEVICE_TYPES= CMAKE_BUILD_PARALLEL_LEVEL=$jobs \
    .venv/bin/pip wheel -q --no-build-isolation --no-deps -w "$out/wheel" . \
    --config-settings=build-dir="$out/build-cuda"
  build="$out/build-cuda"
  # Every device source compiled in it (CMake names the object after the source; a generated
  # unit's lies under the build folder's device/kernels/).
  for src in $sources; do
    case $src in
      "$gen"/*) obj="*jax_rccl_device.dir/device/${src#"$gen"/}.o" ;;
      *) obj="*jax_rccl_device.dir/$src.o" ;;
    esac
    if [ -z "$(find "$build" -path "$obj" -print -quit)" ]; then
      echo "the CUDA build has no object for $src" >&2
      exit 1
    fi
  done
  # The default build targets sm_90 (not nvcc's own default, which a GPU would have to JIT).
  if ! grep -q "sm_90" "$build/build.ninja" 2>/dev/null && \
     ! grep -rqs "sm_90" "$build/CMakeFiles"; then
    echo "the CUDA build does not target sm_90" >&2
    exit 1
  fi
  # Per compile, the seconds ninja recorded (start and end in ms), longest first.
  awk -F'\t' 'NR > 1 && $4 ~ /\.o$/ { printf "%6.0f s  %s\n", ($2 - $1) / 1000, $4 }' \
    "$build/.ninja_log" | sort -rn | sed 's|CMakeFiles/[^/]*\.dir/||'
  echo "sm_90: the CUDA extension with all $(echo "$sources" | wc -w) device sources built in" \
    "$((SECONDS - t0)) s ($jobs jobs)"
else
  echo "nvcc or .venv not found: skipped the CUDA extension build" >&2
fi
echo "device compile: $((SECONDS - started)) s"
