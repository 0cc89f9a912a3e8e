# SPDX-License-Identifier: Apache-2.0
"""The "patch" family: the switch for modules flykernels.patch() replaced (flykernels/_patch.py).
Patched modules run the fused op only while it is installed, so flykernels.torch.disable() and
disabled() turn patched models back to their own forwards like every other family. It changes
nothing in PyTorch itself, so it is supported everywhere and on by default."""
from . import register


class PatchFamily:
    name, kind, default_on = "patch", "module patch", True

    def __init__(self):
        self.on = False

    def supported(self):
        return ""

    def install(self):
        self.on = True

    def remove(self):
        self.on = False

    def installed(self):
        return self.on


register(PatchFamily())
