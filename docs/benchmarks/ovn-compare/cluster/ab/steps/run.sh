#!/bin/bash
# [PREFIX=a6] run.sh CODE OUT [bench options], from the repository: one `fathom bench ovn-compare --replicas 3` under the bench lock,
# with CODE (a directory holding a fathom/ package, put first on PYTHONPATH) and the schedstat
# sampler beside it. steps/ goes on PYTHONPATH too: its sitecustomize.py names each Python thread's
# OS thread (schedstat per thread); nothing else of the run changes.
CODE=$1; OUT=$2; shift 2
export PREFIX=${PREFIX:-a6}
STEPS=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
flock /work/bench.lock bash -c "
  python3 $STEPS/sample.py $OUT/sched.jsonl & S=\$!
  FATHOM_LAB_KEEP_LOGS=$OUT/logs PYTHONPATH=$CODE:$STEPS .venv/bin/fathom bench ovn-compare --replicas 3 \
    --ports 20 --repeats 3 --prefix $PREFIX -o $OUT $* > $OUT/stdout.txt 2> $OUT/stderr.txt
  kill \$S
"
