#!/usr/bin/env bash
# Builds tools/bandwidth.c (gcc -O3 -march=native -fopenmp) into the cache and runs it.
#
#   tools/bandwidth.sh [--mib 1024] [--reps 7] [--threads 1,2]
#
# Prints the meter's JSON (memory read bandwidth, 1 thread and all threads, best-of-N).
# The binary lives at ${KASOKU_CACHE:-~/.cache/kasoku}/bin/bandwidth and is rebuilt when the
# source is newer. Run it on a quiet machine: anything else running lowers the numbers.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${KASOKU_CACHE:-$HOME/.cache/kasoku}
bin=$cache/bin/bandwidth
mkdir -p "$cache/bin"
if [ ! -x "$bin" ] || [ "$here/bandwidth.c" -nt "$bin" ]; then
    gcc -O3 -march=native -fopenmp -Wall -Wextra "$here/bandwidth.c" -o "$bin.tmp"
    mv "$bin.tmp" "$bin"
fi
exec "$bin" "$@"
