# Which shared-memory loads are still in flight (their destination not yet read) at each
# empty-barrier arrive of the widening MX kernel: nvdisasm -c the cubin, then
#   python3 bench/probes/sass_arrive_check.py kernel.sass
# (an arrive ahead of its loads let the TMA overwrite a stage the loads had not read: docs/mxfp.md).
import re,sys
L=[l for l in open(sys.argv[1]).read().split('\n')]
ins=[]
for l in L:
    m=re.search(r'/\*([0-9a-f]+)\*/\s+(.*?)\s*;',l)
    if m: ins.append((m.group(1),m.group(2)))
def regs(s): return set(int(x) for x in re.findall(r'\bR(\d+)\b',s))
bad=0; arr=0
for i,(a,t) in enumerate(ins):
    if not ('SYNCS.ARRIVE' in t and '0x36c18' in t): continue
    arr+=1
    # walk back to the previous full-barrier wait (TRYWAIT) or 400 instrs
    j=i-1
    while j>0 and 'TRYWAIT' not in ins[j][1] and i-j<600: j-=1
    for k in range(j,i):
        tk=ins[k][1]
        mm=re.search(r'\bLDS(\.\S+)?\s+R(\d+),',tk)
        if not mm: continue
        w={'.128':4,'.64':2}.get(mm.group(1) or '',1)
        d=set(range(int(mm.group(2)),int(mm.group(2))+w))
        used=False
        for q in range(k+1,i):
            parts=ins[q][1].split(None,2)
            # sources: everything after the first operand
            body=ins[q][1]
            ops=body.split(',',1)
            src=ops[1] if len(ops)>1 else ''
            if regs(src)&d or ('ST' in body.split()[0] and regs(body)&d): used=True; break
        if not used:
            bad+=1; print('arrive',a,'LDS',ins[k][0],tk,'not consumed before it')
print(arr,'arrives,',bad,'loads in flight at an arrive')
