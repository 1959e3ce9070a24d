"""Device memory per pipeline stage: :func:`estimate_memory` (:mod:`.estimate`) over the terms
(:mod:`.terms`), the tensors alive at the step's peak (:mod:`.step_tensors`), the caching
allocator's simulation (:mod:`.allocator`), the stack's fixed overheads (:mod:`.overheads`),
recompute and FP8's share. Imports only what :mod:`tuner.models` may.
"""
