# SPDX-License-Identifier: Apache-2.0
# For each empty-barrier arrive of the widening MX kernel (mxfp_widen.cu), whether every shared-memory
# load of the stage is ordered before it by a MEMBAR (the proxy fence's lowering) or consumed before
# it. An arrive ahead of its loads let the producer's TMA overwrite a stage the loads had not read yet
# (the intermittent mismatch of 2026-12-06, docs/mxfp.md). Usage:
#   nvdisasm -c mxfp_widen_n128.cubin > k.sass; python3 bench/probes/mxfp/sass_arrive_check.py k.sass
import re
import sys

ins = []
for line in open(sys.argv[1]):
    m = re.search(r'/\*([0-9a-f]+)\*/\s+(.*?)\s*;', line)
    if m:
        ins.append((m.group(1), m.group(2)))
bad = arrives = 0
for i, (addr, text) in enumerate(ins):
    if not ('SYNCS.ARRIVE' in text and '0x36c18' in text):  # the ring's empty barriers
        continue
    arrives += 1
    j = i - 1
    while j > 0 and 'TRYWAIT' not in ins[j][1] and i - j < 600:
        j -= 1
    fences = [k for k in range(j, i) if 'MEMBAR' in ins[k][1]]
    for k in range(j, i):
        if re.search(r'\bLDS(\.\S+)?\s+R\d+,', ins[k][1]) and not any(f > k for f in fences):
            bad += 1
            print('arrive', addr, ': load', ins[k][0], ins[k][1], 'has no fence between it and the arrive')
print(arrives, 'arrives,', bad, 'loads not fenced before their arrive')
sys.exit(1 if bad else 0)
