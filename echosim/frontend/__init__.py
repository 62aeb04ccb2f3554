"""Model -> IR: every frontend (zoo, ``.py``, ``hf:``, ``.onnx``, plugins) ends in the same IR graph.

The public surface for callers and plugin authors: :func:`capture_named` and
:func:`capture_object` (in :mod:`echosim.frontend.capture`), the
:class:`CaptureSpec` a loader's ``capture(spec)`` receives, and :class:`Note`, the
message type a frontend returns for lines the report lists under ``notes``.
"""

from echosim.frontend.capture import capture_named, capture_object
from echosim.frontend.messages import Note
from echosim.frontend.spec import CaptureSpec

__all__ = ["CaptureSpec", "Note", "capture_named", "capture_object"]
