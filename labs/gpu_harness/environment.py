"""The GPU and software a measurement ran on: the key of every recorded entry."""

from __future__ import annotations

import datetime
import subprocess


class NoGpuError(RuntimeError):
    """No CUDA GPU is visible."""


def environment(torch) -> dict:
    """GPU name, compute capability, SM count, driver, torch/CUDA/Triton versions and today's date."""
    if not torch.cuda.is_available():
        raise NoGpuError("no CUDA GPU visible (torch.cuda.is_available() is False); this benchmark needs one")
    props = torch.cuda.get_device_properties(0)
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, check=True, timeout=30).stdout.split("\n")[0].strip()
    except (OSError, subprocess.SubprocessError):
        driver = "unknown"
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "gpu": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
        "sm_count": props.multi_processor_count,
        "driver": driver,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton_version,
        "date": datetime.date.today().isoformat(),
    }
