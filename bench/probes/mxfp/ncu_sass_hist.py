# SPDX-License-Identifier: Apache-2.0
# Instruction mix and warp-stall samples per SASS opcode of one kernel, from ncu's source page:
# the share of executed instructions each opcode takes and the stall samples it collects, then the
# 25 most-sampled instructions. Answers whether a kernel is bound by its conversion chains or its
# MMA issue (bench/logs/mxfp-widen-ncu-sass-hist-h100-2026-12-06.txt, the MX widening kernel).
#   ncu --set full --import-source yes -o rep ...; ncu --import rep.ncu-rep --page source --csv \
#       --print-source sass > source.csv
#   python3 bench/probes/mxfp/ncu_sass_hist.py source.csv
import csv,collections,sys
rows=list(csv.reader(open(sys.argv[1])))
hdr=rows[1]; data=rows[2:]
ie=hdr.index("Instructions Executed"); src=hdr.index("Source"); samp=hdr.index("Warp Stall Sampling (All Samples)")
tot=sum(int(r[ie]) for r in data if r[ie].isdigit())
print("total inst", tot)
op=collections.Counter(); sc=collections.Counter()
for r in data:
    if not r[ie].isdigit(): continue
    t=r[src].split()
    if not t: continue
    o=t[1] if t[0].startswith('@') else t[0]
    o=o.split('.')[0]; op[o]+=int(r[ie]); sc[o]+=int(r[samp] or 0)
for o,c in op.most_common(25): print(f"{o:12s} {c/tot*100:6.2f}%  samples {sc[o]}")
hot=sorted([r for r in data if r[ie].isdigit()], key=lambda r:-int(r[samp] or 0))[:25]
for r in hot: print(r[0][-5:], r[samp], r[ie], r[src].strip()[:90])
