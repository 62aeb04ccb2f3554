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
    # PCIe boards ("A100-PCIE-40GB" as torch spells it), H100 NVL (a PCIe card, 94 GB) and the rest echosim has no
    # backend for: not taken for the SXM parts their names contain.
    (r"(?i:pcie)|\bH100 NVL\b|NV12 pairs|GH200|Gaudi|MI325X|MI355X|Grace", None),
    (r"A100-SXM4-40GB", "a100-40gb"),
    (r"A100", "a100-80gb"),
    (r"H100", "h100-sxm"),
    (r"H800", "h800"),
    (r"H200", "h200"),
    (r"\bGB300", "gb300"),  # "GB300", and torch's "NVIDIA GB300": not the B300 pattern below
    (r"B300", "b300"),
    (r"\bGB200", "gb200"),
    (r"B200", "b200"),
    (r"MI300X", "mi300x"),
)


#: Pattern in a measurement's system description -> the scale-out network it names (networks.NETWORKS);
#: no match: InfiniBand, the backends' default.
SYSTEM_NETWORKS: tuple[tuple[str, str], ...] = ((r"GPUDirect-TCPXO|\bTCPXO\b", "tcpxo"),)
#: (backend, network) -> the backend of that device on that network.
NETWORK_BACKENDS: dict[tuple[str, str], str] = {("h100-sxm", "tcpxo"): "h100-a3mega"}


def network_for_system(system: str) -> str | None:
    """The network a system description names (``GCP A3 Mega (GPUDirect-TCPXO ...)`` -> ``tcpxo``), or ``None``."""
    for pattern, network in SYSTEM_NETWORKS:
        if re.search(pattern, system):
            return network
    return None


def backend_on_network(backend: str, network: str) -> str | None:
    """The backend modelling ``backend``'s device on ``network``, or ``None`` when none does."""
    return NETWORK_BACKENDS.get((backend, network))


def backend_for_device(device_name: str) -> str | None:
    """The backend for a device name (``NVIDIA H200`` -> ``h200``), or ``None`` when none models it."""
    for pattern, backend in DEVICE_PATTERNS:
        if re.search(pattern, device_name):
            return backend
    return None
