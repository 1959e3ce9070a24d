"""A stage's bounds from its kept terms (``stage_figures``) against the bounds of its plan
(``bound.stage_bound`` and ``bound.stage_envelope`` of ``estimate.stage_plan``), to the bit, on
every stage of every valid config of spaces that cut through the fit limit (the fast-path
agreement spaces, and the deep pipelines whose middle stages the judge bounds by a dominator's
envelope) and of spaces that vary each framework's knobs (the kept-terms spaces)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.test_bound import SPACES as DEEP
from tests.test_space_fast import SPACES as NEAR_LIMIT
from tests.test_stage_states import SPACES as FRAMEWORKS
from tuner.catalog import get_gpu
from tuner.config.pipeline import stage_layers
from tuner.models.memory.bound import stage_bound, stage_envelope
from tuner.models.memory.estimate import GIB, stage_plan
from tuner.models.memory.stage_figures import iter_stage_figures_but, stage_figures
from tuner.space.enumerate import iter_configs, study_gpu, study_violations
from tuner.spec.study import StudySpec

SPACES: dict[str, Callable[[], StudySpec]] = {
    **{f"near-{name}": make for name, make in NEAR_LIMIT.items()},
    **{f"knobs-{name}": make for name, make in FRAMEWORKS.items()},
    **{f"near-deep-{name}": make for name, make in DEEP.items()},
}


@pytest.mark.parametrize("name", sorted(SPACES))
def test_a_stages_figures_are_its_plans_bounds_to_the_bit(name: str) -> None:
    spec = SPACES[name]()
    gpu, model, fw = study_gpu(spec), spec.model, spec.framework
    precision = spec.training.precision
    limit = spec.search.memory_headroom * gpu.memory_gib * GIB
    stages = straddling = 0
    for config in iter_configs(spec):
        if study_violations(config, spec):
            continue
        for stage, layers in enumerate(stage_layers(model, config, fw)):
            plan = stage_plan(model, config, gpu, fw, precision, stage)
            figures = stage_figures(model, config, stage, layers, gpu, fw, precision)
            assert figures == (*stage_bound(plan, gpu), stage_envelope(plan, gpu)), (config, stage)
            stages += 1
            straddling += figures[0] <= limit < figures[1]
    assert stages > 10
    if name.startswith("near-"):  # bounds the verdict needs a simulation for
        assert straddling > 0, "stages whose bounds hold the fit limit"


def test_a_cpu_stage_has_its_plans_figures_without_an_allocator() -> None:
    spec = FRAMEWORKS["deepspeed-pipe"]()
    gpu, model, fw = get_gpu("cpu"), spec.model, spec.framework
    config = next(c for c in iter_configs(spec) if not study_violations(c, spec))
    for stage, layers in enumerate(stage_layers(model, config, fw)):
        plan = stage_plan(model, config, gpu, fw, "fp32", stage)
        figures = stage_figures(model, config, stage, layers, gpu, fw, "fp32")
        assert figures == (*stage_bound(plan, gpu), stage_envelope(plan, gpu))


def test_the_stages_a_caller_skips_are_not_bounded() -> None:
    spec = NEAR_LIMIT["dense-16"]()
    gpu, model, fw = study_gpu(spec), spec.model, spec.framework
    config = next(c for c in iter_configs(spec) if not study_violations(c, spec) and c.pp >= 4)
    asked: list[int] = []

    def skip() -> tuple[int | None, ...]:
        asked.append(1)
        return (None, 0) + (None,) * (config.pp - 2)

    out = list(iter_stage_figures_but(model, config, gpu, fw, "bf16", skip))
    assert asked == [1] and out[1] is None and all(f is not None for f in out[2:])
    assert out[0] == stage_figures(model, config, 0, stage_layers(model, config, fw)[0], gpu, fw,
                                   "bf16")  # fmt: skip
