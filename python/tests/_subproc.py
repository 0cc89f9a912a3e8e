# SPDX-License-Identifier: Apache-2.0
"""A fresh interpreter for the tests of import-time behaviour (what `import flykernels` does
depends on the environment it starts in)."""
import os
import subprocess
import sys
import textwrap


def run_py(code, env=None, cwd="/", unset=()):
    """Runs `code` in a new Python (this one's executable) with os.environ minus `unset`, plus
    `env`, from `cwd` (/ by default: not beside a source tree); returns the CompletedProcess."""
    e = {k: v for k, v in os.environ.items() if k not in unset}
    e.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=e, cwd=cwd)
