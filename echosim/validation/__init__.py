"""How close echosim is to measured hardware: ``echosim validate`` and the accuracy page.

The package sits above the compiler (like ``search`` and ``check``): it reads files of
published measurements, asks the compiler and the backends for predictions and reports
the errors. Nothing below it imports it, so the hardware layer never depends on its
own validation.

Training steps (files shaped like ``cases.csv``), one job per module:

* :mod:`~echosim.validation.cases`: read and check the rows; bad input is one line.
* :mod:`~echosim.validation.rows`: a row's model, Plan and Cluster, framework defaults,
  and why a row cannot be expressed yet.
* :mod:`~echosim.validation.published`: the step time a row publishes (or converts to).
* :mod:`~echosim.validation.filters`: ``--filter COLUMN=VALUE``.
* :mod:`~echosim.validation.run`: compile the selected rows and compare.
* :mod:`~echosim.validation.stats`: row results and per-group summaries.

Kernels and collectives (files shaped like ``microbench.csv``):
:mod:`~echosim.validation.microbench`. Reading the results:
:mod:`~echosim.validation.accuracy` (fitted constants, sensitivity) and
:mod:`~echosim.validation.tables` (the terminal tables of ``echosim validate``).

Nothing is imported here, so that importing one module stays cheap.
"""
