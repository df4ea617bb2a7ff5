#!/bin/bash
# run.sh BASE NEW OUT [PAIRS]: PAIRS (default 3) pairs of `fathom bench ovn-compare --replicas 3 --ports 20
# --repeats 3 --stop-others`, the code of checkout BASE then of checkout NEW, each under the bench lock with
# this directory's sitecustomize.py (the write path's steps, logged per controller process) on PYTHONPATH;
# OUT/<base|new>-<i>/: the bench's results.json and summary.md, and write-path/<pid>.log
BASE=$1 NEW=$2 OUT=$3 PAIRS=${4:-3}
HOOK=$(cd "$(dirname "$0")" && pwd)
for i in $(seq "$PAIRS"); do
  for v in base new; do
    tree=$BASE; [ "$v" = new ] && tree=$NEW
    run=$OUT/$v-$i; mkdir -p "$run"
    (cd "$tree" && flock /work/bench.lock env PYTHONPATH="$tree:$HOOK" WRITE_PATH_LOG="$run/write-path" \
      .venv/bin/fathom bench ovn-compare --replicas 3 --ports 20 --repeats 3 --stop-others --prefix wp \
      -o "$run" > "$run/stdout.txt" 2> "$run/stderr.txt"; echo "rc=$? $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$run/stdout.txt")
  done
done
