#!/usr/bin/env bash
# On the lent GPU, after the kit: the ResNet-50 at K = 1, each configuration in a process of its
# own, XLA's autotuning results dumped per configuration. Session 23 saw each compiled program
# of that model run at about 50 or about 70 ms (docs/history/benchmarks.md, "At b34ef60"), whichever
# configuration it was; this says whether the two speeds follow the convolutions' autotuned
# algorithms (diff autotune/N.txt in the tarball: each process's choices, as text protos) and
# whether they survive a process per configuration. About 4 x 80 s on an H100; MODEL= and
# STEPS= to change.
# Everything lands in one file, $OUT/autotune.tar.gz: a call brings back at most 8 files (wave 5,
# session 28 lost all but the first configuration's dump to that limit).
cd "$(dirname "$0")/../.."
export TF_CPP_MIN_LOG_LEVEL=2
dir=$(mktemp -d)/autotune && mkdir -p "$dir"
total=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
if (( ${total:-0} >= 100000 )); then MB1=100000; else MB1=70000; fi
i=0
for config in "one device xla" "mirrored xla" "towers replicated xla" "towers replicated xla, no guard"; do
  i=$((i + 1))
  XLA_FLAGS="--xla_gpu_dump_autotune_results_to=$dir/$i.txt" timeout -k 5 "${LIMIT:-150}" \
    python3 -m towers.bench --suite=models --steps="${STEPS:-20}" --warmup=3 --worker_devices=1 \
    --gpu_split_mb=$MB1 --models="${MODEL:-resnet50}" --compiled=xla --configs="^${config}\$" \
    > "$dir/$i.jsonl" 2> "$dir/$i.err"
  echo "$i ($config) rc=$? $(grep -o '"step_ms": [0-9.]*' "$dir/$i.jsonl" | head -1)"
done
tar czf "$OUT/autotune.tar.gz" -C "$(dirname "$dir")" autotune
