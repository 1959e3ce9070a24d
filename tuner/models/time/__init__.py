"""Step time: :func:`estimate_time` (:mod:`.estimate`) composed of per-layer compute, the
data-parallel reduction (:mod:`.dp`), the pipeline's schedule (:mod:`.pipeline`), DeepSpeed's
engine (:mod:`.deepspeed`), MoE (:mod:`.moe`), FP8, recompute, TP overlap, and the named
breakdown (:mod:`.breakdown`). Imports only what :mod:`tuner.models` may.
"""
