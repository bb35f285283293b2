#!/usr/bin/env bash
# On the lent H200, after the kit: the models suite's workers, one process per device count,
# rows as JSON lines under $OUT (tables: `python -m towers.bench`'s _model_suite on them), and
# each configuration's build and first call on stderr as they end. XLA compiles a ResNet-50
# in 45-60 s per configuration there: pick rows with --configs and give each run its time.
# The runs do not fit one call: ONLY="gpt_k1 gpt_k2" in one, ONLY=resnet_k1 in the next...
# Rows print only when all of a run's configurations are timed (they are timed interleaved):
# a run killed by its timeout prints none. ONLY="gpt_k2 ..." runs those alone; STEPS= sets the
# timed steps (20; each run's limit is for 20).
cd "$(dirname "$0")/../.."
export TF_CPP_MIN_LOG_LEVEL=2
bash .ci/gpu/need_gpu.sh || exit 3
start=$(date +%s)
# The split: one logical GPU of 100000 MiB (K=1) or two of 60000 MiB (K=2) on an H200; on a
# card under 100 GiB (an H100's 80 GiB) 70000 MiB and two of 36000 MiB.
total=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if (( ${total:-0} >= 100000 )); then MB1=100000 MB2=60000; else MB1=70000 MB2=36000; fi
echo "GPU memory ${total} MiB: K=1 on ${MB1} MiB, K=2 on 2 x ${MB2} MiB" | tee -a "$OUT/times.txt"
# AUTOTUNE_DIR=/tmp/autotune: the runs share XLA's per-fusion autotuning results through that
# folder (one machine's calls too), so that a fusion compiled in two processes gets the same
# kernels in both. For the next study, not used for any table yet: whether it narrows the
# spread between processes (session 33: towers at K=1 took 29.42 and 30.94 ms in two processes
# of one run, the floor 28.57 and 28.75).
if [[ -n "${AUTOTUNE_DIR:-}" ]]; then
  mkdir -p "$AUTOTUNE_DIR"
  export XLA_FLAGS="--xla_gpu_per_fusion_autotune_cache_dir=$AUTOTUNE_DIR${XLA_FLAGS:+ $XLA_FLAGS}"
fi
# REPEAT=3: each chosen run three times, a fresh process each ($OUT/name.1.jsonl, ...): one
# process's ratios are one draw of its programs' speeds (session 33). Read them back with
# `python3 -m towers.bench --suite=models --rows_from=name.1.jsonl,name.2.jsonl,name.3.jsonl`.
run() {  # name, seconds, flags...
  local name=$1 limit=$2 out r; shift 2
  if [[ -z "${ONLY:-}" ]]; then [[ $name != final_* ]] || return 0  # (final_*: asked by name)
  else [[ " $ONLY " == *" $name "* ]] || return 0; fi
  for (( r = 1; r <= ${REPEAT:-1}; r++ )); do
    out=$name; (( ${REPEAT:-1} == 1 )) || out=$name.$r
    timeout -k 5 "$limit" python3 -m towers.bench --suite=models --steps="${STEPS:-20}" --warmup=3 \
      "$@" > "$OUT/$out.jsonl" 2> "$OUT/$out.err"
    echo "$out rc=$? at $(( $(date +%s) - start )) s" | tee -a "$OUT/times.txt"
  done
}
# Issue #32's rows, with the default non-finite guard unless a label says otherwise: at K=1
# the whole step compiled on one device, MirroredStrategy (each replica's loss and gradients
# compiled; and its whole replica step), the hand-written loop with its update compiled, and
# towers compiled (its update too; "skip", the default with a loss scale; without the guard;
# with its update uncompiled). At K=2 the
# same less the one-device rows, the embedding's rows gathered (sparse="gather": the default
# "auto" sends it dense on one split GPU), and the ring (what "auto" took before gather_add).
# Uncompiled: one device, MirroredStrategy and towers.
k1='^(one device xla|mirrored xla|mirrored xla, whole replica|hand-written towers xla, update compiled|towers replicated xla|towers replicated xla, skip|towers replicated xla, no guard|towers replicated xla, update uncompiled)$'
k2='^(mirrored xla|hand-written towers xla, update compiled|towers replicated xla|towers replicated xla, skip|towers replicated xla, no guard|towers replicated xla, update uncompiled|towers replicated xla, sparse gather|towers replicated xla, ring, 64 MiB buckets)$'
ours='towers replicated xla|towers replicated xla, no guard|towers replicated xla, update uncompiled'
plain='^(one device|mirrored|towers replicated|towers replicated, no guard)$'
# Seen at e127387: a GPT configuration compiles in 15-55 s, a ResNet-50 one in 45-60 s.
# ResNet-50 runs the targets' rows here (its other rows: the `_rest` runs below).
run gpt_k1 280 --worker_devices=1 --gpu_split_mb=$MB1 --models=gpt --compiled=xla --configs="$k1"
run gpt_k2 330 --worker_devices=2 --gpu_split_mb=$MB2 --models=gpt --compiled=xla --configs="$k2"
run resnet_k1 330 --worker_devices=1 --gpu_split_mb=$MB1 --models=resnet50 --compiled=xla --configs="^(one device xla|mirrored xla|$ours)$"
run resnet_k2 330 --worker_devices=2 --gpu_split_mb=$MB2 --models=resnet50 --compiled=xla --configs="^(mirrored xla|$ours)$"
# The exchange at K=2 (issue #32's K=2 gap): the default (auto, 64 MiB buckets) beside ring and
# reduce-broadcast in 64 MiB buckets, reduce-broadcast in one bucket, and sharded state (each
# copy updates half the weights, then gathers the other half: one update's work, not two, on
# one split GPU).
# "one bucket": the default exchange in one transfer, so that each update waits for one receive
# (a receive completes on the host after its copy has run: docs/history/gpu-sessions.md, session 33).
exchange='^(mirrored xla|towers replicated xla|towers replicated xla, one bucket|towers replicated xla, (ring|reduce-broadcast), 64 MiB buckets|towers replicated xla, reduce-broadcast, one bucket|towers replicated xla, sharded state|hand-written towers xla, update compiled)$'
run gpt_k2_exchange 280 --worker_devices=2 --gpu_split_mb=$MB2 --models=gpt --compiled=xla --configs="$exchange"
run gpt_plain_k1 200 --worker_devices=1 --gpu_split_mb=$MB1 --models=gpt --compiled=plain --configs="$plain"
run gpt_plain_k2 200 --worker_devices=2 --gpu_split_mb=$MB2 --models=gpt --compiled=plain --configs="$plain"
# Issue #32's table with the fewest compiles, for one session's device time (about 750 s with
# the uncompiled runs above): ONLY="final_gpt_k2 final_resnet_k2" in one call, ONLY="final_gpt_k1
# final_resnet_k1" in the next, ONLY="gpt_plain_k1 gpt_plain_k2" in a third. At K=1 the floor,
# MirroredStrategy and towers with and without the guard; at K=2 the same less the floor.
final1='^(one device xla|mirrored xla|towers replicated xla|towers replicated xla, no guard)$'
final2='^(mirrored xla|towers replicated xla|towers replicated xla, no guard)$'
# The GPT at K=2 with "skip" too: "raise" reads flags made before the updates there (wave 5,
# session 25), so it should cost what "skip" costs.
final2g='^(mirrored xla|towers replicated xla|towers replicated xla, skip|towers replicated xla, no guard)$'
run final_gpt_k1 200 --worker_devices=1 --gpu_split_mb=$MB1 --models=gpt --compiled=xla --configs="$final1"
run final_gpt_k2 300 --worker_devices=2 --gpu_split_mb=$MB2 --models=gpt --compiled=xla --configs="$final2g"
run final_resnet_k1 300 --worker_devices=1 --gpu_split_mb=$MB1 --models=resnet50 --compiled=xla --configs="$final1"
run final_resnet_k2 260 --worker_devices=2 --gpu_split_mb=$MB2 --models=resnet50 --compiled=xla --configs="$final2"
# The issue's other rows at the table's commit, each in a process of its own beside the rows it
# is read against (the targets' processes above keep their configurations, as in the tables
# before): MirroredStrategy with the whole replica step compiled (K=1), the hand-written loop
# with its update compiled, and towers with its update uncompiled.
rest1='^(one device xla|mirrored xla|mirrored xla, whole replica|hand-written towers xla, update compiled|towers replicated xla|towers replicated xla, update uncompiled)$'
rest2='^(mirrored xla|hand-written towers xla, update compiled|towers replicated xla|towers replicated xla, update uncompiled)$'
run final_gpt_k1_rest 240 --worker_devices=1 --gpu_split_mb=$MB1 --models=gpt --compiled=xla --configs="$rest1"
run final_gpt_k2_rest 240 --worker_devices=2 --gpu_split_mb=$MB2 --models=gpt --compiled=xla --configs="$rest2"
run final_resnet_k1_rest 280 --worker_devices=1 --gpu_split_mb=$MB1 --models=resnet50 --compiled=xla --configs="$rest1"
run final_resnet_k2_rest 260 --worker_devices=2 --gpu_split_mb=$MB2 --models=resnet50 --compiled=xla --configs="$rest2"
