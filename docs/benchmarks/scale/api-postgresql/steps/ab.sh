#!/bin/bash
# usage: ab.sh TAG PORTS ROUNDS TREE_A TREE_B  -> /tmp/c4/runs/TAG-{a,b}-N
cd /work/wt-cpu4
TAG=$1; PORTS=$2; R=$3; A=$4; B=$5
mkdir -p /tmp/c4/runs
for i in $(seq 1 $R); do
  for v in a b; do
    tree=$A; [ $v = b ] && tree=$B
    out=/tmp/c4/runs/$TAG-$v-$i
    PYTHONPATH=$tree timeout 900 .venv/bin/python /tmp/c4/prof.py $out $PORTS 1 > $out.log 2>&1
    python3 - $out <<'PY'
import json,sys
r=json.load(open(sys.argv[1]+"/r.json")); p=r["schedstat_ms_per_port"]
print(sys.argv[1].split("/")[-1], f'{r["ports_per_second"]:.0f}/s cp {r["control_plane_cpu_ms_per_port"]:.2f} loop {p.get("controller event loop",0):.2f} other {p.get("controller other threads",0):.2f} pg {p.get("postgresql backends",0):.2f} err {r["n_errors"]}', flush=True)
PY
  done
done
