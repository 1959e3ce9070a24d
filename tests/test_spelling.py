"""The one compact spelling of a config (tuner.config.spelling) and the number formats."""

from __future__ import annotations

from tuner.config.parallel import ParallelConfig
from tuner.config.spelling import KNOBS, glossary, spell, split_constant
from tuner.report import units


def test_one_config_spells_every_knob_off_its_default() -> None:
    c = ParallelConfig(tp=4, pp=4, dp=32, vp=4, sequence_parallel=True, micro_batch_size=1,
                       global_batch_size=1024)  # fmt: skip
    assert spell(c) == "tp4 pp4 dp32 vp4 sp mbs1 ga32"
    full = ParallelConfig(tp=2, pp=2, cp=2, dp=2, recompute="full", recompute_method="uniform",
                          recompute_num_layers=1, distributed_optimizer=True, zero_stage=1,
                          global_batch_size=8, tp_comm_overlap=True)  # fmt: skip
    assert spell(full) == "tp2 pp2 dp2 cp2 tpo mbs1 ga4 full:uniform:1 distopt zero1"


def test_rows_show_what_differs_and_the_rest_is_named_once() -> None:
    a = ParallelConfig(tp=1, pp=2, dp=4, micro_batch_size=1, global_batch_size=64)
    b = ParallelConfig(tp=1, pp=2, dp=4, micro_batch_size=2, global_batch_size=64,
                       recompute="selective")  # fmt: skip
    constant, rows = split_constant([a, b])
    assert constant == "tp1, pp2, dp4, no sp, no tpo, no distopt"  # "no" binds to one knob
    assert rows == ["mbs1 ga16", "mbs2 ga8 selective"]
    assert split_constant([a]) == ("", [spell(a)])


def test_a_framework_without_a_knob_is_not_told_it_is_off() -> None:
    """A DeepSpeed table said ``no sp, no tpo, no distopt``: knobs DeepSpeed does not have."""
    a = ParallelConfig(tp=1, pp=1, dp=2, micro_batch_size=1, global_batch_size=8, zero_stage=1)
    b = ParallelConfig(tp=1, pp=1, dp=2, micro_batch_size=2, global_batch_size=8, zero_stage=1)
    by_framework = {f: split_constant([a, b], f)[0] for f in
                    ("deepspeed", "megatron-deepspeed", "megatron", "megatron-bridge",
                     "torchtitan")}  # fmt: skip
    assert by_framework == {
        "deepspeed": "tp1, pp1, dp2, no recompute, zero1",
        "megatron-deepspeed": "tp1, pp1, dp2, no sp, no recompute, zero1",  # no tpo, no distopt
        "megatron": "tp1, pp1, dp2, no sp, no tpo, no recompute, no distopt, zero1",
        "megatron-bridge": "tp1, pp1, dp2, no sp, no tpo, no recompute, no distopt, zero1",
        "torchtitan": "tp1, pp1, dp2, no sp, no tpo, no recompute, zero1",
    }
    assert split_constant([a, b])[0] == by_framework["megatron"]  # no framework: every knob


def test_every_knob_is_in_the_glossary() -> None:
    text = glossary()
    assert all(k.name in text and k.meaning in text for k in KNOBS)


def test_one_format_per_quantity() -> None:
    assert [units.seconds(v) for v in (1.5383, 0.012345, 12.345, 1234.5, 0.0)] == [
        "1.538", "0.01235", "12.35", "1,234", "0"]  # fmt: skip
    assert units.percent(0.5635) == "56.4" and units.rate(1990.4) == "1,990"
    assert units.gib(61.26) == "61.3" and units.gib(0.1061) == "0.106"
    assert units.gib(8.1) == "8.10" and units.gib(0.1) == "0.100"  # the same digits everywhere


def test_node_hours_never_show_a_spent_figure_as_zero() -> None:
    """A CPU demo spends about 0.002 node-hours; two fixed decimals printed it as ``0.00``."""
    assert [units.node_hours(v) for v in (31.934, 1.0, 0.1234, 0.0021, 0.0, 1234.5)] == [
        "31.93", "1.00", "0.12", "0.0021", "0", "1,234.50"]  # fmt: skip
    assert units.node_hours(0.5) == "0.50"  # the trailing zero kept: 0.5 beside 0.53 misread


def test_the_framework_probes_tables_spell_a_point_as_every_table_does() -> None:
    """``tune profile --probe``'s runs table spelled its points from their keys (``pp=1 dp=2
    gbs=16 recompute=none zero=0``) beside its terms table's own ``none zero0``, and ``tune
    estimate`` said ``measured at tp1 mbs2 none zero0``: the one spelling now, whose knobs a
    probed point has (no dp, no ga: the point stands for every config sharing its knobs)."""
    from tests.test_stack_terms import probe_rows, spec_of
    from tuner.cli.probe import runs_grid, terms_grid
    from tuner.profile.stack_terms import derive_terms

    spec = spec_of()
    rows = probe_rows(spec)
    runs = runs_grid(spec, {"rows": rows, "created": "2026-01-01T00:00:00+00:00"})
    assert runs.constant == "tp1, mbs2"
    assert [(r[0], r[1]) for r in runs.rows] == [
        ("pp1 dp2 ga2 zero0", "1"), ("pp1 dp2 ga2 zero0", "4"),
        ("pp1 dp2 ga4 zero0", "1"),  # the base point at twice the global batch
        ("pp1 dp2 ga2 zero1", "4"), ("pp1 dp2 ga2 full:uniform:1 zero0", "4"),
        ("pp2 dp1 ga4 zero0", "1"),
    ]  # fmt: skip
    for row, cells in zip(rows, runs.rows, strict=True):  # the tables' formats: no 1.234e+04
        assert (cells[2], cells[4]) == (units.seconds(row.step_s), units.gib(row.peak_gib))
    points = derive_terms(spec, rows).points
    terms = terms_grid(points, spec.framework)
    assert terms.constant == "tp1, mbs2"
    assert [r[0] for r in terms.rows] == ["pp1 zero0", "pp1 zero1", "pp1 full zero0", "pp2 zero0"]
    assert [p.label for p in points][:2] == ["tp1 pp1 mbs2", "tp1 pp1 mbs2 zero1"]
