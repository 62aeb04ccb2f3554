"""The backend that models a device, found from the name a vendor gives it.

Measurement tables (the ``device`` column of ``microbench.csv``) and
``torch.cuda.get_device_name()`` spell devices as they are sold (``A100-SXM4-40GB``,
``NVIDIA H200``), not as echosim's backends are named. Validation and calibration both
need the same translation, and it is hardware knowledge, so it lives here once.
"""

from __future__ import annotations

import re

#: Device name pattern -> backend name (``None``: real hardware echosim has no backend for yet).
#: Order matters: the first pattern that matches wins.
DEVICE_PATTERNS: tuple[tuple[str, str | None], ...] = (
    (r"PCIe|NV12 pairs|GH200|Gaudi|MI325X|MI355X|Grace", None),
    (r"A100-SXM4-40GB", "a100-40gb"),
    (r"A100", "a100-80gb"),
    (r"H100", "h100-sxm"),
    (r"H800", "h800"),
    (r"H200", "h200"),
    (r"^GB300", "gb300"),
    (r"B300", "b300"),
    (r"^GB200", "gb200"),
    (r"B200", "b200"),
    (r"MI300X", "mi300x"),
)


def backend_for_device(device_name: str) -> str | None:
    """The backend for a device name (``NVIDIA H200`` -> ``h200``), or ``None`` when none models it."""
    for pattern, backend in DEVICE_PATTERNS:
        if re.search(pattern, device_name):
            return backend
    return None
