#!/bin/bash
# run.sh TREE OUT: one `fathom bench ovn-compare --replicas 3 --ports 20 --repeats 3 --stop-others` with the
# code of checkout TREE and this directory's sitecustomize.py on PYTHONPATH (psycopg's prepare decisions
# counted in each controller process), under the bench lock; OUT: the bench's results and prepared/<pid>.json
TREE=$1 OUT=$2
HOOK=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
(cd "$TREE" && flock /work/bench.lock env PYTHONPATH="$TREE:$HOOK" PREP_LOG="$OUT/prepared" \
  .venv/bin/fathom bench ovn-compare --replicas 3 --ports 20 --repeats 3 --stop-others --prefix pp \
  -o "$OUT" > "$OUT/stdout.txt" 2> "$OUT/stderr.txt"; echo "rc=$? $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/stdout.txt")
