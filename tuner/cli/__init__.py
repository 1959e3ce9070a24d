"""The ``tune`` command line: each command's options and output, over the same calls as the
Python API. The entry point is :func:`tuner.cli.main.main`, the parser and the handlers
:mod:`.commands`; tables (:mod:`.tables`), live progress (:mod:`.progress`) and the ``profile``,
``calibrate``, ``parse-log`` and ``report`` commands have their own modules.

The top layer: it may import anything in the package, and nothing in the package imports it.
"""
