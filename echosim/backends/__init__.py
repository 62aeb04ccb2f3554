"""Hardware backends: devices as data, compute and collective cost models, built-in backends.

Nothing is imported here so that ``import echosim`` stays cheap; use
``echosim.backends.gpu.builtin_backends()`` or the modules directly.
"""
