#!/usr/bin/env bash
# Build llama.cpp (the side-by-side peer and reference) from the source that the PyPI sdist
# llama-cpp-python==0.3.36 vendors. Nothing here is needed by CI.
#
#   tools/build_llama_cpp.sh            # idempotent: skips steps already done
#
# Layout under ${KASOKU_CACHE:-~/.cache/kasoku}/llama.cpp/:
#   sdist/llama_cpp_python-0.3.36/            unpacked sdist (Python package llama_cpp + vendor/)
#   src -> sdist/.../vendor/llama.cpp         llama.cpp source, convert_hf_to_gguf.py, gguf-py/
#   src/build/bin/                            llama-bench llama-quantize llama-server llama-cli libllama.so
#   toolvenv/                                 cmake + ninja from PyPI
#   VERSION                                   commit / version record
#
# Env: KASOKU_CACHE (cache root), JOBS (default: nproc), NICE (default 19).
set -euo pipefail

VERSION=0.3.36
cache=${KASOKU_CACHE:-$HOME/.cache/kasoku}
root=$cache/llama.cpp
jobs=${JOBS:-$(nproc)}
nice_lvl=${NICE:-19}
targets=(llama-bench llama-quantize llama-server llama-cli)
mkdir -p "$root"
log() { echo "[build_llama_cpp $(date +%T)] $*" >&2; }

# 1. sdist (source only for this package; the build tools come as wheels).
sdist_dir=$root/sdist/llama_cpp_python-$VERSION
if [ ! -d "$sdist_dir/vendor/llama.cpp" ]; then
  log "downloading llama-cpp-python==$VERSION sdist"
  mkdir -p "$root/dl" "$root/sdist"
  pip download -q --no-deps --no-binary llama-cpp-python "llama-cpp-python==$VERSION" -d "$root/dl"
  tar -xzf "$root/dl/llama_cpp_python-$VERSION.tar.gz" -C "$root/sdist"
fi
ln -sfn "$sdist_dir/vendor/llama.cpp" "$root/src"

# 2. cmake + ninja from PyPI.
tv=$root/toolvenv
if [ ! -x "$tv/bin/cmake" ] || [ ! -x "$tv/bin/ninja" ]; then
  log "creating tool venv (cmake, ninja)"
  python3 -m venv "$tv"
  "$tv/bin/pip" install -q cmake ninja
fi
export PATH=$tv/bin:$PATH

# 3. configure + build. Use the real path, not the src symlink: the vendored .git file points to
# ../../.git/modules/..., and through the symlink ninja sees that dependency as always dirty.
src=$sdist_dir/vendor/llama.cpp
bin=$src/build/bin
built=1
for t in "${targets[@]}"; do [ -x "$bin/$t" ] || built=0; done
# The CPU features to build for. Not -march=native: some virtual machines report AMX (Sapphire
# Rapids) while their kernel refuses AMX state, and a native build then dies with SIGILL at
# its first matrix product. The x86-64 SIMD levels kasoku's own kernels use, explicitly
# (override with LLAMA_CPU_FLAGS, e.g. "-DGGML_NATIVE=ON" on a machine where native works).
cpu_flags=${LLAMA_CPU_FLAGS:-"-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=OFF"}
grep -q -- "$cpu_flags" "$root/configure.flags" 2>/dev/null || built=0
if [ $built = 1 ] && [ -f "$bin/libllama.so" ]; then
  log "already built: $bin"
else
  if [ ! -f "$src/build/build.ninja" ] || ! grep -q "$src/CMakeLists.txt" "$src/build/build.ninja" \
     || ! grep -q -- "$cpu_flags" "$root/configure.flags" 2>/dev/null; then
    rm -rf "$src/build"
    log "configuring"
    (cd "$src" && cmake -B build -G Ninja -DCMAKE_BUILD_TYPE=Release $cpu_flags \
      -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF >"$root/configure.log" 2>&1)
    echo "$cpu_flags" >"$root/configure.flags"
  fi
  log "building ${targets[*]} with -j$jobs at nice $nice_lvl (≈15 min on 2 cores)"
  start=$(date +%s)
  (cd "$src" && nice -n "$nice_lvl" cmake --build build -j"$jobs" --target "${targets[@]}" >"$root/build.log" 2>&1) \
    || { tail -30 "$root/build.log" >&2; exit 1; }
  log "built in $(( $(date +%s) - start )) s"
fi

# 4. record the version.
commit=unknown
if [ -f "$src/build/common/build-info.cpp" ]; then
  commit=$(sed -n 's/.*LLAMA_COMMIT *= *"\([^"]*\)".*/\1/p' "$src/build/common/build-info.cpp" | head -1)
fi
{
  echo "llama-cpp-python=$VERSION"
  echo "llama.cpp commit=$commit"
  echo "bench_version=$("$bin/llama-cli" --version 2>&1 | tr '\n' ' ' | sed 's/  */ /g')"
  echo "built=$(date -u +%FT%TZ)"
  echo "flags=-DCMAKE_BUILD_TYPE=Release $cpu_flags -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF"
} >"$root/VERSION"
log "done; $(cat "$root/VERSION" | head -3 | tr '\n' ';')"
echo "$root"
