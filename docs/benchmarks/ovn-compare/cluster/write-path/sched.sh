#!/bin/bash
# sched.sh OUT [bench options...]: one `fathom bench ovn-compare --replicas 3 --ports 20 --repeats 3 --stop-others`
# (the code as it is), and 2 s into its measurement `perf sched record` for 10 s over the machine; OUT/tids.txt
# names the threads of each controller still running and the PostgreSQL sessions of each lab's database, and
# sched_summary.py OUT/tids.txt OUT/timehist.txt gives their scheduling delays (OUT/sched.json)
OUT=$1; shift; mkdir -p "$OUT"
HERE=$(cd "$(dirname "$0")" && pwd)
(
  until grep -q "repeat 1/3" "$OUT/stderr.txt" 2>/dev/null; do sleep 0.2; done
  sleep 2
  for pid in $(pgrep -f "fathom controller --db"); do
    [ "$(awk '{print $3}' /proc/$pid/stat)" = T ] && continue
    db=$(tr '\0' ' ' < /proc/$pid/cmdline | grep -o 'fathom_test_[0-9]*' | head -1)
    for t in $(ls /proc/$pid/task); do echo "$t controller:$db"; done
  done > "$OUT/tids.txt"
  for p in $(pgrep -x postgres); do
    db=$(tr '\0' ' ' < /proc/$p/cmdline | grep -o 'fathom_test_[0-9]*' | head -1)
    [ -n "$db" ] && echo "$p postgresql:$db"
  done >> "$OUT/tids.txt"
  perf sched record -o "$OUT/perf.data" -- sleep 10 > "$OUT/perf.log" 2>&1
  perf sched timehist -i "$OUT/perf.data" > "$OUT/timehist.txt" 2>/dev/null
) &
flock /work/bench.lock .venv/bin/fathom bench ovn-compare --replicas 3 --ports 20 --repeats 3 --stop-others \
  --prefix ws -o "$OUT" "$@" > "$OUT/stdout.txt" 2> "$OUT/stderr.txt"
wait
python3 "$HERE/sched_summary.py" "$OUT/tids.txt" "$OUT/timehist.txt" > "$OUT/sched.json"
