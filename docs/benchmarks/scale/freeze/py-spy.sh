#!/bin/bash
# The 100 x 100 scale bench with py-spy (--gil, 100 Hz, 14 s) on the controller while it times the new
# ports; the raw folded samples of the 01:00 UTC run are py-spy-samples.raw beside this. Usage: py-spy.sh OUT
cd "$(git rev-parse --show-toplevel)"
out=${1:?output dir}; mkdir -p $out
.venv/bin/fathom bench scale --part fabric --sizes 100x100 --samples 20 -o $out/run > $out/bench.log 2>&1 &
while ! grep -q "timing 20 new ports" $out/bench.log; do sleep 1; if ! kill -0 $! 2>/dev/null; then break; fi; done
pid=$(pgrep -f "fathom controller.*scale-bsc/fabric" | head -1)
echo "pid $pid" >> $out/bench.log
py-spy record -p $pid -r 100 --gil -f raw -o $out/spy.raw -d 14 --nonblocking >> $out/spy.log 2>&1
wait
cp /run/fathom-bench/scale-bsc/fabric/controller.log $out/controller.log
echo done > $out/DONE
