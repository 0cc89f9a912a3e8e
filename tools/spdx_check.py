#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Checks (or, with --fix, adds) the SPDX licence line in every tracked source file FlyKernels owns.

  tools/spdx_check.py [--fix] [REPO_ROOT]

Kinds: *.c *.cpp *.h *.hpp *.cu *.cuh *.py *.sh *.cmake CMakeLists.txt *.in (CMake templates,
embed.S.in) and the .ci/ scripts. Data (json, sql, md, logs, patches, images) is not checked.
The line goes first, or after a shebang (and a Python coding line right after it). Also checks that
python/LICENSE (the copy the wheel carries) matches LICENSE. Exit 1 when something is missing,
77 (skip) outside a git checkout.
"""
import re
import subprocess
import sys
from pathlib import Path

TAG = "SPDX-License-Identifier: Apache-2.0"
SLASH = {".c", ".cpp", ".h", ".hpp", ".cu", ".cuh"}
HASH = {".py", ".sh", ".cmake"}
SKIP = ()  # third-party or generated tracked files, none at present


def comment(path):
    """The SPDX line in the file's comment syntax, or None when the file is not a checked kind."""
    name, suffix = path.name, path.suffix
    if name.endswith(".S.in"):
        return f"/* {TAG} */"  # preprocessed assembly: '#' would be a directive
    if suffix in SLASH:
        return f"// {TAG}"
    if suffix in HASH or name == "CMakeLists.txt" or name.endswith((".cmake.in", ".pc.in")):
        return f"# {TAG}"
    if path.parts[0] == ".ci":
        return f"# {TAG}"  # shell scripts (.ci/run has no suffix)
    return None


def tracked(root):
    """The tracked files, or None outside a git checkout (a source tarball: nothing to check)."""
    try:
        r = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True)
    except OSError:
        return None
    if r.returncode != 0:
        return None
    return [Path(p) for p in r.stdout.decode().split("\0") if p]


def insert_at(lines):
    i = 0
    if lines and lines[0].startswith("#!"):
        i = 1
    if len(lines) > i and re.match(r"^[ \t\f]*#.*?coding[:=][ \t]*[-\w.]+", lines[i]):
        i += 1
    return i


def main(argv):
    fix = "--fix" in argv
    args = [a for a in argv if a != "--fix"]
    root = Path(args[0]) if args else Path(__file__).resolve().parent.parent
    files = tracked(root)
    if files is None:
        print(f"spdx: {root} is not a git checkout (or git is missing): skipped")
        return 77
    missing, fixed = [], []
    for rel in files:
        line = comment(rel)
        if line is None or str(rel) in SKIP:
            continue
        p = root / rel
        if not p.is_file():
            continue
        text = p.read_text(encoding="utf-8")
        lines = text.splitlines(keepends=True)
        if any(TAG in l for l in lines[:5]):
            continue
        if not fix:
            missing.append(str(rel))
            continue
        i = insert_at(lines)
        lines.insert(i, line + "\n")
        p.write_text("".join(lines), encoding="utf-8")
        fixed.append(str(rel))
    lic, copy = root / "LICENSE", root / "python" / "LICENSE"
    if not lic.is_file() or not copy.is_file() or lic.read_bytes() != copy.read_bytes():
        missing.append("python/LICENSE (must be a copy of LICENSE)")
    for f in fixed:
        print(f"spdx: added to {f}")
    for f in missing:
        print(f"spdx: missing '{TAG}': {f}", file=sys.stderr)
    if missing:
        print(f"spdx: {len(missing)} file(s) lack the licence line; run tools/spdx_check.py --fix", file=sys.stderr)
        return 1
    print("spdx: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
