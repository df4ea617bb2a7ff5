#!/bin/bash
# steps.sh TREE OUT: the write path's steps (../../write-path's hook), every call to the master of c1's
# br-int: OUT/base-1 with the other replicas stopped (--stop-others), OUT/new-1 with them running
# (../to_master.py); summarize with ../../write-path/summarize.py OUT and table.py
TREE=$1 OUT=$2
HERE=$(cd "$(dirname "$0")" && pwd)
HOOK=$HERE/../../write-path
for run in base-1 new-1; do
  out=$OUT/$run; mkdir -p "$out"
  cmd=".venv/bin/fathom"; [ $run = new-1 ] && cmd=".venv/bin/python $HERE/../to_master.py"
  (cd "$TREE" && flock /work/bench.lock env PYTHONPATH="$TREE:$HOOK" WRITE_PATH_LOG="$out/write-path" $cmd \
    bench ovn-compare --replicas 3 --ports 20 --repeats 3 --stop-others --prefix st -o "$out" \
    > "$out/stdout.txt" 2> "$out/stderr.txt"; echo "rc=$? $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/stdout.txt")
done
