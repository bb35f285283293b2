#!/usr/bin/env bash
# On the lent H200, after the kit: the state suite (sharded optimizer state's memory and step
# time beside unsharded Replicated) on the GPU split into 2 and 4 logical GPUs; table to $OUT.
cd "$(dirname "$0")/../.."
export TF_CPP_MIN_LOG_LEVEL=2
timeout -k 5 240 python3 -m towers.bench --suite=state --towers=2,4 --optimizer=adam \
  --gpu_split_mb=8000 --steps=10 > "$OUT/state.txt" 2> "$OUT/state.err"
echo "state rc=$?"
cat "$OUT/state.txt"
