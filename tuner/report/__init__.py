"""The HTML report of a study (``tune report``): one self-contained offline page.

``data`` reads the study's storage (never the loop), ``figures`` draws the plotly figures,
``page`` lays out the sections into ``page.html.j2``, ``build`` writes the file and the PNGs,
``cli`` is the ``tune report`` subcommand. Importing this package imports none of them (plotly
loads only when a report is built).
"""
