#!/bin/bash
# run.sh OUT [VARIABLE=value...], from the repository: one `fathom bench ovn-compare --replicas 3` under the
# bench lock, with this directory on PYTHONPATH (its sitecustomize.py: the measurement hook, driven by the
# variables given) and the controllers' logs kept in OUT/logs
OUT=$1; shift
STEPS=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
flock /work/bench.lock env PYTHONPATH=$PWD:$STEPS "$@" FATHOM_LAB_KEEP_LOGS=$OUT/logs bash -c "uptime > $OUT/uptime.txt; date -u >> $OUT/uptime.txt; .venv/bin/fathom bench ovn-compare --replicas 3 --ports 20 --repeats 3 --prefix w9 -o $OUT > $OUT/stdout.txt 2> $OUT/stderr.txt; echo rc=\$? >> $OUT/uptime.txt"
