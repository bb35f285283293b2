#!/usr/bin/env bash
# On the lent H200, after ../shared/gpu's kit (`. .gpu/kit/on_device.sh`): the GPU tier and the
# default suite side by side (BUILD.md's "GPU tier"), logs under $OUT. About 5 minutes.
# With NOFIX=path/to/an/old/ops/_all_reduce_gradients.py, the copies tests run again in a copy
# of the checkout that has it (they must fail there: the check that they test the fix).
cd "$(dirname "$0")/../.."
bash .ci/gpu/need_gpu.sh || exit 3
start=$(date +%s)
( TOWERS_TEST_KIND=GPU timeout 420 python3 -m pytest -q -n 8 -p no:cacheprovider --durations=20 > "$OUT/gpu_tier.log" 2>&1 ) &
( timeout 420 python3 -m pytest -q -n 6 -p no:cacheprovider --durations=20 > "$OUT/default.log" 2>&1 ) &
wait
echo "both tiers: $(( $(date +%s) - start )) s" > "$OUT/times.txt"
if [ -n "${NOFIX:-}" ]; then
  rm -rf /tmp/nofix && cp -a . /tmp/nofix && cp "$NOFIX" /tmp/nofix/ops/_all_reduce_gradients.py
  ( cd /tmp/nofix && PYTHONPATH=/tmp/nofix TOWERS_TEST_KIND=GPU timeout 150 python3 -m pytest -q -n 8 \
      -p no:cacheprovider tests/ops/all_reduce_gradients_test.py tests/towers/variables/replicated_test.py \
      tests/towers/optimizers/rules_test.py -k "plain_mean or momentum_per_copy or TowersTest" ) > "$OUT/nofix.log" 2>&1
fi
grep -hE "^(FAILED|ERROR)" "$OUT"/gpu_tier.log "$OUT"/default.log | cut -c1-220 | head -60
for f in "$OUT"/gpu_tier.log "$OUT"/default.log; do tail -n 1 "$f"; done
cat "$OUT/times.txt"
