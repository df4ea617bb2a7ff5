#!/bin/bash
# run.sh TREE OUT [PAIRS] [MODES]: with ./sitecustomize.py in every controller, PAIRS (default 2) rounds of
# `fathom bench ovn-compare --replicas 3 --ports 20 --repeats 3`, every call to the master of c1's br-int, one run
# per mode of MODES (default "stopped running") in turn: OUT/stopped-N with the other replicas stopped
# (--stop-others), OUT/running-N with them running (../prepared/to_master.py), OUT/niced-N with them running, their
# threads and PostgreSQL sessions at nice 19 (to_master.py's --prefix tp), OUT/idle-N with them running, their
# threads and every PostgreSQL session of theirs under SCHED_IDLE (--prefix tf); then `python3 window.py OUT`
TREE=$1 OUT=$2 PAIRS=${3:-2} MODES=${4:-stopped running}
HERE=$(cd "$(dirname "$0")" && pwd)
for i in $(seq 1 "$PAIRS"); do
  for mode in $MODES; do
    out=$OUT/$mode-$i; mkdir -p "$out"
    cmd=".venv/bin/python $HERE/../prepared/to_master.py" prefix=fo
    [ "$mode" = stopped ] && cmd=".venv/bin/fathom"
    [ "$mode" = niced ] && prefix=tp
    [ "$mode" = idle ] && prefix=tf
    (cd "$TREE" && flock /work/bench.lock env PYTHONPATH="$TREE:$HERE" FOLLOWERS_LOG="$out/log" $cmd \
      bench ovn-compare --replicas 3 --ports 20 --repeats 3 --stop-others --prefix $prefix -o "$out" \
      > "$out/stdout.txt" 2> "$out/stderr.txt"; echo "rc=$? $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/stdout.txt")
  done
done
