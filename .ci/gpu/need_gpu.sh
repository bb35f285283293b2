#!/usr/bin/env bash
# On the lent GPU machine, before any device script: exits 0 where TensorFlow sees a GPU, and
# otherwise at once with rc 3 and a line saying why (on stderr and in $OUT/times.txt).
# Session 41 lost three calls (900 s) to runs that found no TensorFlow CUDA setup (a call
# that did not carry .gpu/kit: no kit to source) and ran on the CPU until their timeouts.
#   bash .ci/gpu/need_gpu.sh && python3 .ci/gpu/trace.py ...
# (.ci/gpu/tier.sh and models.sh run it themselves.)
if python3 -c "import sys, tensorflow as tf; sys.exit(not tf.config.list_physical_devices('GPU'))" \
    > /dev/null 2>&1; then
  exit 0
fi
message="no GPU visible to TensorFlow here: source the kit first (. .gpu/kit/on_device.sh), \
and carry .gpu/kit on every call (an ignored path is on the machine only in a call that carries it)"
echo "$message" >&2
[[ -n "${OUT:-}" ]] && echo "$message" >> "$OUT/times.txt"
exit 3
