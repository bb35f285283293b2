"""The benchmark program, run as `python -m towers.bench`; `import towers` never imports it.

    python -m towers.bench                                  # step suite, 1, 4 and 8 devices
    python -m towers.bench --models=many_small --towers=8 --steps=50
    python -m towers.bench --suite=weights --weights_mb=100

Suites:
  step: median step time of plain-SGD training steps for each model and device count:
    one device at the same global batch, a hand-written tower loop, MirroredStrategy in a
    custom loop, and `towers` (parameter server; replicated with each all-reduce). Each
    device count runs in a fresh process (devices are simulated on CPU-only machines).
  weights: time to save and to restore a set of float32 weights in each format.

Its flags exist only in `__main__`, when it runs as a program.
"""
