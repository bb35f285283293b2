#!/usr/bin/env bash
# On the lent H200, after the kit: the models suite's workers, one process per device count,
# rows as JSON lines under $OUT (tables: `python -m towers.bench`'s _model_suite on them), and
# each configuration's build and first call on stderr as they end. XLA compiles a ResNet-50
# in 45-60 s per configuration there: pick rows with --configs and give each run its time.
# Rows print only when all of a run's configurations are timed (they are timed interleaved):
# a run killed by its timeout prints none. ONLY="gpt_k2 ..." runs those alone.
cd "$(dirname "$0")/../.."
export TF_CPP_MIN_LOG_LEVEL=2
start=$(date +%s)
run() {  # name, seconds, flags...
  local name=$1 limit=$2; shift 2
  [[ -z "${ONLY:-}" || " $ONLY " == *" $name "* ]] || return 0
  timeout -k 5 "$limit" python3 -m towers.bench --suite=models --steps=20 --warmup=3 "$@" \
    > "$OUT/$name.jsonl" 2> "$OUT/$name.err"
  echo "$name rc=$? at $(( $(date +%s) - start )) s" | tee -a "$OUT/times.txt"
}
xla='^(one device|mirrored|hand-written towers|towers replicated|towers ps) xla$'
few='^(one device|mirrored|towers replicated) xla$'
pair='^(mirrored|towers replicated) xla$'
# Seen at 97b3a65: gpt_k1 135 s, resnet_k1 112 s; gpt_k2 with all five rows passed 170 s
# (its one-device and hand-written rows compile in 45-55 s each), hence the pair at K=2.
run gpt_k1 170 --worker_devices=1 --gpu_split_mb=100000 --models=gpt --configs="$xla"
run gpt_k2 150 --worker_devices=2 --gpu_split_mb=60000 --models=gpt --configs="$pair"
run resnet_k1 190 --worker_devices=1 --gpu_split_mb=100000 --models=resnet50 --configs="$few"
