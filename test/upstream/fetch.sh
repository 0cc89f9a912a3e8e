#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# PyTorch's own tests for the ops FlyKernels overrides, for one torch version, into a git-ignored
# folder (third-party code: never committed; test/upstream/run.sh runs them, README.md says how).
#
#   test/upstream/fetch.sh [VERSION] [DEST]
#     VERSION  torch version whose tag to fetch (2.11.0 -> tag v2.11.0); default: the installed
#              torch's (python3 -c 'import torch'), else an error
#     DEST     default .upstream (files land in DEST/vVERSION/test/)
#   Env: UPSTREAM_BASE_URL   raw-file base (default https://raw.githubusercontent.com/pytorch/pytorch)
#        PYTORCH_CHECKOUT    a local pytorch git clone to read the tag from instead of the network
#                            (git -C $PYTORCH_CHECKOUT show vVERSION:test/...)
#
# Fetches test/test_transformers.py (SDPA), test/test_matmul_cuda.py (F.grouped_mm) and
# test/test_scaled_matmul_cuda.py (F.scaled_mm), then every module they import that is a file of
# PyTorch's test/ folder rather than part of the wheel (torch.testing._internal is in the wheel; a
# helper such as test_cpp_extensions_open_device_registration is not), recursively. Writes
# DEST/vVERSION/SOURCE (tag, origin, sha256 of each file) and adds /DEST/ to .git/info/exclude.
set -euo pipefail
root=$(git rev-parse --show-toplevel 2>/dev/null || pwd)
ver=${1:-}
if [ -z "$ver" ]; then
  ver=$(python3 -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null) || {
    echo "fetch.sh: no VERSION given and no torch to ask (pass e.g. 2.11.0)" >&2
    exit 2
  }
fi
dest=${2:-$root/.upstream}
tag=v$ver
base=${UPSTREAM_BASE_URL:-https://raw.githubusercontent.com/pytorch/pytorch}
out=$dest/$tag
mkdir -p "$out/test"

# One file of the tag into $out; 0 when it exists upstream.
get() {
  local rel=$1 dst=$out/$1
  mkdir -p "$(dirname "$dst")"
  if [ -n "${PYTORCH_CHECKOUT:-}" ]; then
    git -C "$PYTORCH_CHECKOUT" show "$tag:$rel" > "$dst.part" 2>/dev/null || { rm -f "$dst.part"; return 1; }
  elif command -v curl > /dev/null; then
    curl -fsSL --retry 2 --connect-timeout 15 -o "$dst.part" "$base/$tag/$rel" 2>/dev/null || { rm -f "$dst.part"; return 1; }
  else
    python3 - "$base/$tag/$rel" "$dst.part" <<'EOF' || { rm -f "$dst.part"; return 1; }
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=30) as r, open(sys.argv[2], "wb") as f:
    f.write(r.read())
EOF
  fi
  mv "$dst.part" "$dst"
}

main_files="test/test_transformers.py test/test_matmul_cuda.py test/test_scaled_matmul_cuda.py"
for f in $main_files; do
  if ! get "$f"; then
    echo "fetch.sh: could not fetch $f at $tag from ${PYTORCH_CHECKOUT:-$base} (no network? set" \
         "PYTORCH_CHECKOUT to a pytorch clone, or UPSTREAM_BASE_URL to a mirror)" >&2
    exit 1
  fi
  echo "fetched $f"
done

# Helpers: top-level names imported anywhere in the fetched files that are neither the standard
# library nor an installed / well-known package, tried as test/<name>.py (a 404 means "not a test
# helper"); new files are scanned too.
scan() {
  python3 - "$@" <<'EOF'
import re, sys
names = set()
for path in sys.argv[1:]:
    for line in open(path, encoding="utf-8", errors="replace"):
        m = re.match(r"\s*(?:from\s+([A-Za-z_]\w*)[\w.]*\s+import|import\s+([A-Za-z_]\w*))", line)
        if m:
            names.add(m.group(1) or m.group(2))
std = set(getattr(sys, "stdlib_module_names", ()))
known = {"torch", "numpy", "scipy", "sympy", "pytest", "expecttest", "hypothesis", "triton", "packaging",
         "typing_extensions", "fairseq", "transformers", "tabulate", "psutil", "yaml", "jinja2", "filelock",
         "networkx", "fsspec", "optree", "einops", "mpmath", "functorch", "torchvision", "torchaudio", "onnx"}
for n in sorted(names - std - known):
    print(n)
EOF
}
tried=" test_transformers test_matmul_cuda test_scaled_matmul_cuda "
todo=$(cd "$out" && scan $main_files)
for round in 1 2 3; do
  new=""
  for name in $todo; do
    case "$tried" in *" $name "*) continue ;; esac
    tried="$tried$name "
    if get "test/$name.py"; then
      echo "fetched test/$name.py (a helper the tests import)"
      new="$new test/$name.py"
    fi
  done
  [ -z "$new" ] && break
  todo=$(cd "$out" && scan $new)
done

{
  echo "tag $tag"
  echo "origin ${PYTORCH_CHECKOUT:-$base}"
  echo "fetched $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  (cd "$out" && find test -name '*.py' -type f | sort | xargs sha256sum)
} > "$out/SOURCE"
echo "wrote $out/SOURCE"

# Keep the folder out of git (third-party code).
if gitdir=$(git -C "$root" rev-parse --git-path info/exclude 2>/dev/null); then
  case "$gitdir" in /*) ex=$gitdir ;; *) ex=$root/$gitdir ;; esac
  rel=${dest#"$root"/}
  [ "$rel" = "$dest" ] || {
    mkdir -p "$(dirname "$ex")"
    grep -qxF "/$rel/" "$ex" 2>/dev/null || echo "/$rel/" >> "$ex"
  }
fi
