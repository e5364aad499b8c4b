"""Which machine a result was measured on: GPU name, GPU count, and how the GPUs are linked.

A multi-GPU figure means nothing without the link it crossed (NV18 NVLink,
PCIe through a switch, PCIe through the CPU), so recorded results are keyed
by all three. The link comes from `nvidia-smi topo -m`, the matrix that
names the path between every pair of GPUs; where it cannot be read the
record says "unknown" rather than guessing.
"""

from __future__ import annotations

import re
import shutil
import subprocess


def topology_between(a: int = 0, b: int = 1) -> str:
    """The `nvidia-smi topo -m` cell for GPUs a and b (NV18, PIX, PXB, PHB, NODE, SYS), or 'unknown'."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return "unknown"
    try:
        text = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    for line in text.splitlines():
        cells = line.split()
        if cells and cells[0] == f"GPU{a}" and len(cells) > b + 1:
            return cells[b + 1]
    return "unknown"


def describe(gpu_count: int | None = None) -> dict:
    """{'gpu', 'gpu_count', 'interconnect'} of this machine (interconnect only when count > 1)."""
    import torch

    if not torch.cuda.is_available():
        return {"gpu": "cpu", "gpu_count": 0, "interconnect": None}
    count = torch.cuda.device_count() if gpu_count is None else gpu_count
    return {"gpu": torch.cuda.get_device_name(0), "gpu_count": count,
            "interconnect": topology_between(0, 1) if count > 1 else None}


def versions() -> dict:
    import torch

    out = {"torch": torch.__version__}
    if torch.cuda.is_available():
        out["cuda"] = torch.version.cuda
        try:
            out["nccl"] = ".".join(str(x) for x in torch.cuda.nccl.version())
        except Exception:  # noqa: BLE001 - a build without NCCL still records the rest
            pass
    return out
