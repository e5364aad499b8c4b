"""Shared test setup: the `gpu` marker, the interpreter switch, and required extras.

Three promises live here, so every test file gets them without repeating them:

* A test marked ``gpu`` is skipped on a machine without CUDA, with the reason
  printed. A test marked ``multigpu(n)`` needs n GPUs and is never also marked
  ``gpu``, so a one-GPU run (``-m gpu``) does not select it; with fewer GPUs it
  is skipped with the count in the reason, and ``LABS_REQUIRE_MULTIGPU=1`` (the
  multi-GPU run) turns that skip into a failure. On the GPU box we run ``LABS_REQUIRE_GPU=1 pytest -m gpu``; there a
  skipped GPU test is turned into a failure, so "all green" cannot hide a test
  that never ran.
* Without CUDA, Triton kernels run in the CPU interpreter. ``TRITON_INTERPRET``
  must be set before Triton is first imported, so it is set here, at collection
  (and vLLM is told to use its CPU platform, for the same reason).
* Under ``CI=true`` a missing vLLM or Chromium is a failure, not a skip
  (``require_or_skip``): CI installs both, so their absence is a broken install.
"""

from __future__ import annotations

import importlib.util
import os
import random
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


HAS_CUDA = _cuda_available()
REQUIRE_GPU = os.environ.get("LABS_REQUIRE_GPU") == "1"
REQUIRE_MULTIGPU = os.environ.get("LABS_REQUIRE_MULTIGPU") == "1"


def _cuda_count() -> int:
    if not HAS_CUDA:
        return 0
    import torch

    return torch.cuda.device_count()
IN_CI = os.environ.get("CI", "").lower() == "true"

if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
    # vLLM picks its platform once, at first use; without a GPU it can only infer
    # one when told. Set here, before any test imports vLLM, so test order cannot matter.
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def require_or_skip(available: bool, what: str, reason: str) -> None:
    """Skip when `what` is missing, except under CI=true, where it fails the test."""
    if available:
        return
    if IN_CI:
        pytest.fail(f"{what} is missing under CI=true ({reason}); .ci/run installs it", pytrace=False)
    pytest.skip(f"{what} not installed: {reason}")


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)
        multi = item.get_closest_marker("multigpu")
        if multi is not None:
            if item.get_closest_marker("gpu") is not None:
                raise pytest.UsageError(f"{item.nodeid}: a multigpu test must not also be marked gpu "
                                        "(a one-GPU run with -m gpu would select it and skip it)")
            need = multi.args[0] if multi.args else 2
            have = _cuda_count()
            if have < need:
                item.add_marker(pytest.mark.skip(reason=f"needs {need} CUDA GPUs, this machine has {have}"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if REQUIRE_GPU and report.skipped and "gpu" in item.keywords:
        report.outcome = "failed"
        report.longrepr = f"GPU test skipped while LABS_REQUIRE_GPU=1: {report.longrepr}"
    if REQUIRE_MULTIGPU and report.skipped and "multigpu" in item.keywords:
        report.outcome = "failed"
        report.longrepr = f"multi-GPU test skipped while LABS_REQUIRE_MULTIGPU=1: {report.longrepr}"


@pytest.fixture(autouse=True)
def _seed():
    """Every test starts from the same seed, so a failure reproduces."""
    random.seed(0)
    try:
        import numpy as np

        np.random.seed(0)
    except ImportError:
        pass
    if "torch" in __import__("sys").modules:
        import torch

        torch.manual_seed(0)
    yield
