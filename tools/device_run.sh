#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Build + test + benchmark on the GPU machine (used through the device tool).
#   tools/device_run.sh <build-dir> [cmake args...]
# Configures against the carried .devdeps SQLite headers and the system's runtime libsqlite3.
set -uo pipefail
bdir=${1:-build}; shift || true
root=$(pwd)
sqlite_lib=$(ls /usr/lib/x86_64-linux-gnu/libsqlite3.so* 2>/dev/null | head -1)
cmake -S . -B "$bdir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DSQLite3_INCLUDE_DIR="$root/.devdeps/usr/include" -DSQLite3_LIBRARY="$sqlite_lib" "$@"
