import sys, statistics as st
for path in sys.argv[1:]:
    rows=[l.split() for l in open(path) if l.strip()]
    pairs={}
    for r in rows:
        pairs.setdefault(r[0],{})[r[1]]=r
    print("==", path)
    d_ps=[]; d_w=[]; b=[]; c=[]; bw=[]; cw=[]; loads=[]
    for i,p in sorted(pairs.items(), key=lambda x:int(x[0])):
        if 'base' not in p or 'ci4' not in p: continue
        B,C=p['base'],p['ci4']
        bp,cp=float(B[6]),float(C[6]); bwall,cwall=float(B[5]),float(C[5])
        b.append(bp); c.append(cp); bw.append(bwall); cw.append(cwall)
        d_ps.append(cp-bp); d_w.append(cwall-bwall)
        loads += [float(B[3]),float(B[4]),float(C[3]),float(C[4])]
        print(f"pair {i}: base {bp:.1f} s (load {B[3]}-{B[4]}, {B[2]}) {B[7]}  ci4 {cp:.1f} s (load {C[3]}-{C[4]}, {C[2]}) {C[7]}  diff {cp-bp:+.1f}  whole {cwall-bwall:+.1f}")
    f=lambda x: f"{st.median(x):.1f} ({min(x):.1f}-{max(x):.1f})"
    print(f"median: base {f(b)}  ci4 {f(c)}  ci4-base {f(d_ps)}  whole-process {f(d_w)}  load {min(loads):.1f}-{max(loads):.1f}")
