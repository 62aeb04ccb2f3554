"""echosim: simulate one distributed training step from the model itself.

Importing the package is cheap: torch, onnx and plugins load only when used.
"""

from __future__ import annotations

__version__ = "0.1.0"
