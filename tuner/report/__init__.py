"""The HTML report of a study (``tune report``): one self-contained offline page.

``leaderboard`` is every measured trial as a pandas table and the best trial's exports,
``data`` reads the study's storage (never the loop), ``figures`` draws the plotly figures,
``page`` lays out the sections into ``page.html.j2``, ``build`` writes the file and the PNGs (the
``tune report`` subcommand is :mod:`tuner.cli.report`). Importing this package imports none of
them (plotly loads only when a report is built).

May import: the study's storage (:mod:`tuner.study`), launch, logs, models and below. Never the
CLI.
"""
