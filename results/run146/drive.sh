#!/bin/bash
# Alternate default and plain servers, a fresh one per try; each try's engine trace kept as trace_<cfg>_<i>.log
# Run from a subfolder: TRIES=3 CFGS="default plain" PASSES=1 ../drive.sh (DEFAULT_EXTRA / PLAIN_EXTRA: "--no-freeze" for a server that does not freeze its heap after the warm-up)
PLAIN="$PLAIN_EXTRA --candidates 0 --window 1 --no-auto-window --memory-tokens 0 --no-recycle --no-context-match --no-seed-from-prompt --no-seed-from-output"
export OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
for i in $(seq 1 $TRIES); do
  for cfg in $CFGS; do
    port=$((47000 + RANDOM % 1000))
    if [ $cfg = plain ]; then extra=$PLAIN; else extra="$DEFAULT_EXTRA"; fi
    python ../trace_server.py.txt $port $extra > /tmp/srv_$cfg_$i.out 2>&1 &
    pid=$!
    for k in $(seq 1 120); do curl -s http://127.0.0.1:$port/health >/dev/null && break; sleep 1; done
    echo -n "$cfg $i: "; python ../wave_client.py.txt $port $PASSES
    kill -TERM $pid; wait $pid 2>/dev/null
    cp /tmp/trace_$port.log trace_${cfg}_$i.log
  done
done
