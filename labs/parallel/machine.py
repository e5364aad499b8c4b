"""The software a run used, stored beside every recorded row (the machine itself: labs.recorded.local_machine).

A collective's time depends on the NCCL build as much as on the link, so a
recorded multi-GPU row carries torch, CUDA and NCCL versions.
"""

from __future__ import annotations


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
