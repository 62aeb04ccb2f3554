"""Built-in commands of the ``echosim`` command line that are not about compiling a model.

``cost`` (one op on one backend), ``validate`` (predictions against published
measurements) and ``calibrate`` (measure this machine, fit a backend). Each module is a
built-in plugin listed in :data:`echosim.plugins.manager.BUILTIN_PLUGINS` and adds its
command through ``register_commands``, exactly as a third-party plugin would. The
commands parse options, call the library (:mod:`echosim.backends`,
:mod:`echosim.validation`, :mod:`echosim.calibrate`) and format; they sit at the top of
the package, beside :mod:`echosim.cli`, and nothing in the library imports them.
"""
