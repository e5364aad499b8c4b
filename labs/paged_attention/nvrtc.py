"""CUDA C++ compiled at run time with NVRTC and launched through the CUDA driver API.

Why not a C++ extension: building one needs nvcc, a C++ compiler and torch's headers on
the reader's machine. NVRTC is a shared library that PyTorch's CUDA wheels already
depend on (`nvidia-cuda-nvrtc`), and the driver API is in `libcuda`, which every
machine with an NVIDIA driver has. Both are reached with ctypes, so the lab still
imports only torch and the standard library. Compilation needs no GPU: `compile_cubin`
runs on a laptop, which is how the tests check the kernel's registers and spills.

A launch goes to torch's current stream, so it is ordered with torch's own work and is
captured by `torch.cuda.graph` like any other kernel.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
import re
import sys

_NVRTC_SUCCESS = 0
_CUDA_SUCCESS = 0


class NvrtcError(RuntimeError):
    """NVRTC is missing, or the source did not compile (the message holds NVRTC's log)."""


def _candidates() -> list[str]:
    """Where libnvrtc may be: next to PyTorch's CUDA wheels first, then the system's."""
    found = []
    for base in sys.path:
        for pattern in ("nvidia/cu*/lib/libnvrtc.so*", "nvidia/cuda_nvrtc/lib/libnvrtc.so*"):
            found += sorted(glob.glob(os.path.join(base, pattern)), reverse=True)
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            found += sorted(glob.glob(os.path.join(home, "lib64", "libnvrtc.so*")), reverse=True)
    # The builtins and the alternative build are loaded by libnvrtc itself.
    return [p for p in found if "builtins" not in p and ".alt." not in p] + ["libnvrtc.so"]


@functools.lru_cache(maxsize=1)
def _nvrtc() -> ctypes.CDLL:
    errors = []
    for path in _candidates():
        try:
            # libnvrtc opens its builtins by name at compile time; outside the loader's
            # search path (a wheel's lib folder) it finds them only if they are loaded already.
            for builtins in sorted(glob.glob(os.path.join(os.path.dirname(path), "libnvrtc-builtins.so*"))):
                if ".alt." not in builtins:
                    ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
            return ctypes.CDLL(path)
        except OSError as exc:
            errors.append(f"{path}: {exc}")
    raise NvrtcError("NVRTC (libnvrtc) was not found; install PyTorch's CUDA build or the CUDA toolkit. "
                     f"Tried: {'; '.join(errors[-3:])}")


def nvrtc_version() -> tuple[int, int]:
    major, minor = ctypes.c_int(), ctypes.c_int()
    _nvrtc().nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return major.value, minor.value


def _check_nvrtc(lib, status: int, what: str) -> None:
    if status != _NVRTC_SUCCESS:
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        raise NvrtcError(f"{what}: {lib.nvrtcGetErrorString(status).decode()}")


def compile_cubin(source: str, name: str, arch: int, options: tuple[str, ...] = ()) -> tuple[bytes, str]:
    """(cubin, NVRTC's log) for compute capability `arch` (90 for sm_90). Raises NvrtcError with the log."""
    lib = _nvrtc()
    prog = ctypes.c_void_p()
    _check_nvrtc(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None),
                 "nvrtcCreateProgram")
    try:
        opts = [f"--gpu-architecture=sm_{arch}", "--std=c++17", *options]
        argv = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        status = lib.nvrtcCompileProgram(prog, len(opts), argv)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log_buf = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log_buf)
        log = log_buf.value.decode(errors="replace")
        if status != _NVRTC_SUCCESS:
            raise NvrtcError(f"{name} did not compile for sm_{arch}:\n{log}")
        lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
        cubin = ctypes.create_string_buffer(size.value)
        _check_nvrtc(lib, lib.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
        return cubin.raw, log
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def ptxas_report(log: str) -> dict:
    """Registers, spill bytes and shared memory from a log compiled with --ptxas-options=-v."""
    def num(pattern: str) -> int:
        m = re.search(pattern, log)
        return int(m.group(1)) if m else 0
    return {"registers": num(r"Used (\d+) registers"), "spill_stores": num(r"(\d+) bytes spill stores"),
            "spill_loads": num(r"(\d+) bytes spill loads"), "stack": num(r"(\d+) bytes stack frame"),
            "shared": num(r"(\d+) bytes smem")}


@functools.lru_cache(maxsize=1)
def _driver() -> ctypes.CDLL:
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as exc:  # pragma: no cover - a GPU machine always has it
        raise RuntimeError(f"the CUDA driver library (libcuda.so.1) could not be loaded: {exc}") from exc


def _check_cuda(status: int, what: str) -> None:
    if status != _CUDA_SUCCESS:
        text = ctypes.c_char_p()
        _driver().cuGetErrorString(status, ctypes.byref(text))
        raise RuntimeError(f"{what} failed: CUDA error {status} ({(text.value or b'?').decode()})")


def _make_context_current(drv) -> None:
    """The driver API works in the thread's current context: torch's, the device's primary one."""
    import torch

    torch.cuda.init()
    ctx = ctypes.c_void_p()
    _check_cuda(drv.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
    if not ctx.value:  # a thread torch has not used yet: bind the primary context, as the runtime does
        device = ctypes.c_int()
        _check_cuda(drv.cuDeviceGet(ctypes.byref(device), torch.cuda.current_device()), "cuDeviceGet")
        _check_cuda(drv.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device), "cuDevicePrimaryCtxRetain")
        _check_cuda(drv.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


class Kernel:
    """One __global__ function of a cubin, loaded into the current device's context."""

    def __init__(self, cubin: bytes, name: str):
        drv = _driver()
        _make_context_current(drv)
        self._image = ctypes.create_string_buffer(cubin, len(cubin))  # kept alive with the module
        self._module = ctypes.c_void_p()
        _check_cuda(drv.cuModuleLoadData(ctypes.byref(self._module), self._image), "cuModuleLoadData")
        self._function = ctypes.c_void_p()
        _check_cuda(drv.cuModuleGetFunction(ctypes.byref(self._function), self._module, name.encode()),
                    f"cuModuleGetFunction({name})")
        self.name = name

    def __call__(self, grid: tuple[int, int, int], block: tuple[int, int, int], args: list) -> None:
        """Launch on torch's current stream. args: ctypes values, in the kernel's parameter order."""
        import torch

        params = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.byref(a), ctypes.c_void_p) for a in args])
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        launch = _driver().cuLaunchKernel
        launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
        _check_cuda(launch(self._function, *grid, *block, 0, stream, params, None),
                    f"launching {self.name}")
