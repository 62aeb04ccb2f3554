"""Real clusters are not ideal: what a compiled step becomes on a cluster that fails, straggles,
mixes hardware, trains with rare synchronisation or changes size.

Each module reads a finished :class:`~echosim.timeline.report.Report` (or compiles through
:mod:`echosim.compiler`) and adds figures beside it; none changes how one step is simulated.

- :mod:`~echosim.dynamics.goodput`: checkpoints, failures and restarts (Young/Daly), goodput
  and time to train.
- :mod:`~echosim.dynamics.stragglers`: the expected slowest of N per-device step times.
- :mod:`~echosim.dynamics.lowcomm`: DiLoCo, streaming DiLoCo and gossip as data-parallel strategies.
- :mod:`~echosim.dynamics.cluster`: a cluster of device pools and the links between them.
- :mod:`~echosim.dynamics.replan`: the best layout for a new device count and the cost of the switch.
"""
