#!/usr/bin/env bash
# On the lent GPU, after the kit: the ResNet-50 at K = 1, each configuration in a process of its
# own, XLA's autotuning results dumped per configuration. Session 23 saw each compiled program
# of that model run at about 50 or about 70 ms (docs/benchmarks.md, "At b34ef60"), whichever
# configuration it was; this says whether the two speeds follow the convolutions' autotuned
# algorithms (diff $OUT/autotune/*.txt, text protos of each process's choices) and whether they
# survive a process per configuration. About 4 x 80 s on an H100; MODEL= and STEPS= to change.
cd "$(dirname "$0")/../.."
export TF_CPP_MIN_LOG_LEVEL=2
mkdir -p "$OUT/autotune"
total=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
if (( ${total:-0} >= 100000 )); then MB1=100000; else MB1=70000; fi
i=0
for config in "one device xla" "mirrored xla" "towers replicated xla" "towers replicated xla, no guard"; do
  i=$((i + 1))
  XLA_FLAGS="--xla_gpu_dump_autotune_results_to=$OUT/autotune/$i.txt" timeout -k 5 "${LIMIT:-150}" \
    python3 -m towers.bench --suite=models --steps="${STEPS:-20}" --warmup=3 --worker_devices=1 \
    --gpu_split_mb=$MB1 --models="${MODEL:-resnet50}" --compiled=xla --configs="^${config}\$" \
    > "$OUT/autotune/$i.jsonl" 2> "$OUT/autotune/$i.err"
  echo "$i ($config) rc=$? $(grep -o '"step_ms": [0-9.]*' "$OUT/autotune/$i.jsonl" | head -1)"
done
