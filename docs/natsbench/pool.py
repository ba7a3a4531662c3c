# Pools the natsbench results of one side-by-side session (BENCHMARKS.md, "NATS sidecar
# throughput and replay"): per side, the medians over all rounds of its files
# docs/natsbench/<ts>-<side><i>.json, and each round's rate on every other path over the
# same round's direct rate. Sides default to window1000-before and window1000-after.
# Usage: python3 docs/natsbench/pool.py <ts> [side ...]
import json,glob,statistics as st,sys
ts=sys.argv[1]
sides=sys.argv[2:] or ['window1000-before','window1000-after']
def pct(xs,p):
    xs=sorted(xs); k=(len(xs)-1)*p; f=int(k); c=min(f+1,len(xs)-1); return xs[f]+(xs[c]-xs[f])*(k-f)
for side in sides:
    rows={}
    loads=[]
    for f in sorted(glob.glob(f'docs/natsbench/{ts}-{side}[0-9]*.json')):
        d=json.load(open(f))
        for r in d['results']:
            rows.setdefault(r['path'],[]).append((f,r['round'],r))
            loads.append(r['load1'])
    direct={ (f,rd):r for f,rd,r in rows['direct']}
    print(side, 'rounds', len(rows['direct']), 'load1 %.2f-%.2f'%(min(loads),max(loads)))
    for p in [p for p in ['direct','relay','sidecar','replay'] if p in rows]:
        rates=[r['msgPerSecond'] for _,_,r in rows[p]]
        chunks=[c for _,_,r in rows[p] for c in r['chunkMs']]
        b=st.median([r['benchCpuUsPerMsg'] for _,_,r in rows[p]]); s=st.median([r['serverCpuUsPerMsg'] for _,_,r in rows[p]])
        line=f"  {p}: msg/s median {st.median(rates):,.0f}, p95 chunk {pct(chunks,0.95):.1f} ms, cpu {b:.1f}/{s:.1f}"
        logs=[r.get('logServerCpuUsPerMsg',0) for _,_,r in rows[p]]
        if any(logs):
            line+=f" + log server {st.median(logs):.1f}"
        if p!='direct':
            ratios=[r['msgPerSecond']/direct[(f,rd)]['msgPerSecond']*100 for f,rd,r in rows[p]]
            line+=f", vs direct median {st.median(ratios):.1f}% (IQR {pct(ratios,.25):.1f}-{pct(ratios,.75):.1f}%), p95 ratio {pct(ratios,.95):.1f}%"
        print(line)
