"""The probe's terms table says "nil" for a term measured at or under nothing (the models take it
as none), where it printed ``x0.000`` (the CPU demo's ``layer acts`` of full recomputation,
its ``step overhead`` in a noisy run), which read as a broken ratio."""

from __future__ import annotations

import dataclasses


def test_a_term_measured_at_nothing_reads_nil_and_is_explained() -> None:
    from tests.test_stack_terms import probe_rows, spec_of
    from tuner.cli.probe import CATALOG_CELL, NIL_CELL, terms_grid
    from tuner.profile.stack_terms import derive_terms

    spec = spec_of()
    points = derive_terms(spec, probe_rows(spec)).points
    plain = terms_grid(points, spec.framework)
    assert not any(NIL_CELL in row for row in plain.rows)
    assert not any(n.startswith(f"{NIL_CELL}:") for n in plain.notes)
    full = next(i for i, p in enumerate(points) if p.recompute == "full")
    nil = [dataclasses.replace(p, activation_scale=0.0, overhead_scale=0.0) if i == full else p
           for i, p in enumerate(points)]  # fmt: skip
    grid = terms_grid(nil, spec.framework)
    cells = grid.rows[full]
    assert cells[4] == NIL_CELL and cells[5] == NIL_CELL  # step overhead, layer acts
    assert not any("x0.000" in cell for row in grid.rows for cell in row)
    assert any(n.startswith(f"{NIL_CELL}: ") and "take it as none" in n for n in grid.notes)
    assert cells[3] == plain.rows[full][3]  # other cells as they were
    assert CATALOG_CELL in plain.rows[0]  # not measured stays "-", not nil
