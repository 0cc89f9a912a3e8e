#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Leave-one-out check of the GEMM dispatch's nearest-row rule on the tuning logs (CPU only).

Every shape in bench/logs/tune-*.tsv (flytune --times output: "dtype layout M=.. N=.. K=..",
variant, us) is a query; the other shapes of its dtype and layout are the database. The rule
(src/tuning_db.cpp key_distance: weighted |log2| distance over the key dims N, K, M) picks the
nearest shape whose winner was also timed on the query, and the regret is that variant's time
over the query's best. Prints the geomean regret, how many queries lose more than 10%, for the
shipped weights (4, 2, 1) and alternatives.
  python3 bench/probes/gemm/dispatch_loo.py
"""
import glob, math, collections, itertools
T=collections.defaultdict(dict)  # (dt,lay,M,N,K) -> {variant: us}
for f in glob.glob('bench/logs/tune-*.tsv'):
    for line in open(f):
        p=line.rstrip('\n').split('\t')
        if len(p)<3: continue
        h=p[0].split()
        try:
            dt,lay=h[0],h[1]; kv=dict(x.split('=') for x in h[2:5]); key=(dt,lay,int(kv['M']),int(kv['N']),int(kv['K']))
            us=float(p[2])
        except Exception: continue
        v=p[1]
        if v not in T[key] or us<T[key][v]: T[key][v]=us
keys=list(T)
print(len(keys),'shapes')
def dist(a,b,w):
    return sum(wi*abs(math.log2(max(x,1))-math.log2(max(y,1))) for wi,x,y in zip(w,a,b))
def evaluate(w):
    regrets=[];miss=0
    for q in keys:
        best=min(T[q].values())
        cands=[r for r in keys if r!=q and r[:2]==q[:2]]
        # query dims in DB order (N,K,M)
        qd=(q[3],q[4],q[2])
        cands.sort(key=lambda r: dist((r[3],r[4],r[2]),qd,w))
        got=None
        for r in cands:
            win=min(T[r],key=T[r].get)
            if win in T[q]: got=T[q][win]; break
            # else try next nearest (dispatch skips unbundled)
        if got is None: miss+=1; continue
        regrets.append(got/best)
    g=math.exp(sum(map(math.log,regrets))/len(regrets))
    return g, sum(1 for x in regrets if x>1.1), len(regrets), miss
for w in [(4,2,1),(1,1,1),(2,2,1),(1,1,2),(1,1,4),(2,1,4),(4,2,4),(1,2,4),(2,2,4),(1,1,8)]:
    print(w, ['%.4f'%x if isinstance(x,float) else x for x in evaluate(w)])
