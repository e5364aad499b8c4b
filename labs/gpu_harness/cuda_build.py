"""Build a lab's CUDA file with torch.utils.cpp_extension.load_inline, and check it without a GPU.

A lab keeps its kernels in a plain `.cu` file: CUDA runtime only, no torch headers, and
host launchers that take device pointers as int64 (from `tensor.data_ptr()`), so the
same file compiles with a bare `nvcc -c` on a machine without torch or a GPU. The
launchers return the `cudaError_t` of the launch, and Python turns a non-zero one into
an exception that names the kernel.

`check_source` is what CI can do without nvcc: every launcher named in the lab's
declarations is defined in the file, every kernel it expects is there, and the braces
balance. Where nvcc is installed, `nvcc_compile` builds the file for sm_90 as the GPU
run will.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

# What the GPU run compiles with: one architecture, named, so the kernels use Hopper's
# own machine code and the build does not also compile for every arch torch knows.
ARCH_FLAGS = ["-gencode", "arch=compute_90,code=sm_90"]
NVCC_FLAGS = ["-O3", *ARCH_FLAGS, "-lineinfo"]

_DECL = re.compile(r"^\s*(?P<ret>[\w:<>]+)\s+(?P<name>\w+)\s*\((?P<args>[^)]*)\)\s*;\s*$", re.M)


class SourceError(ValueError):
    """The CUDA file does not define what its lab declares."""


@dataclass(frozen=True)
class CudaSource:
    """A lab's CUDA file, the C++ declarations of its launchers, and the kernels it must hold."""

    path: Path
    declarations: str  # one C++ prototype per line; load_inline binds each to Python
    kernels: tuple[str, ...]  # __global__ function names (templates by their base name)

    @property
    def text(self) -> str:
        return self.path.read_text(encoding="utf-8")

    @property
    def functions(self) -> list[str]:
        return [m.group("name") for m in _DECL.finditer(self.declarations)]


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def global_kernels(text: str) -> list[str]:
    """Names of the __global__ functions in a CUDA source (templates once, by name)."""
    code = _strip_comments(text)
    lb = r"(?:__launch_bounds__\s*\([^)]*\)\s*)?"
    names = re.findall(rf"__global__\s+{lb}void\s+{lb}(\w+)\s*\(", code)
    return list(dict.fromkeys(names))


def check_source(src: CudaSource) -> None:
    """Raise SourceError unless the file defines every declared launcher and expected kernel."""
    code = _strip_comments(src.text)
    if code.count("{") != code.count("}") or code.count("(") != code.count(")"):
        raise SourceError(f"{src.path.name}: unbalanced braces or parentheses")
    if "torch/" in code or "ATen/" in code:
        raise SourceError(f"{src.path.name}: includes torch headers; keep the file CUDA-runtime only")
    found = set(global_kernels(src.text))
    missing = [k for k in src.kernels if k not in found]
    if missing:
        raise SourceError(f"{src.path.name}: kernels {missing} not defined (found {sorted(found)})")
    for m in _DECL.finditer(src.declarations):
        name, args = m.group("name"), m.group("args")
        definition = re.search(rf"\b{re.escape(m.group('ret'))}\s+{name}\s*\(([^)]*)\)\s*\{{", code)
        if definition is None:
            raise SourceError(f"{src.path.name}: launcher {name}() declared but not defined")
        if _arg_types(definition.group(1)) != _arg_types(args):
            raise SourceError(f"{src.path.name}: {name}() defined with ({definition.group(1).strip()}), "
                              f"declared with ({args.strip()})")


def _arg_types(args: str) -> list[str]:
    """Parameter types without names: 'int64_t src, int n' -> ['int64_t', 'int']."""
    out = []
    for part in filter(None, (a.strip() for a in args.split(","))):
        words = part.replace("*", " * ").split()
        out.append(" ".join(words[:-1]) if len(words) > 1 else words[0])
    return out


def nvcc_compile(src: CudaSource, out_dir: Path, nvcc: str | None = None) -> subprocess.CompletedProcess:
    """Compile the file to an object with the GPU run's flags and `-Xptxas -v` (registers per kernel)."""
    nvcc = nvcc or shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    obj = out_dir / (src.path.stem + ".o")
    return subprocess.run([nvcc, "-c", *NVCC_FLAGS, "-Xptxas", "-v", "-o", str(obj), str(src.path)],
                          capture_output=True, text=True, timeout=300)


def ptxas_registers(ptxas_output: str) -> dict[str, int]:
    """Registers per kernel (mangled name) from `-Xptxas -v` output."""
    regs, current = {}, None
    for line in ptxas_output.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            current = m.group(1)
        m = re.search(r"Used (\d+) registers", line)
        if m and current:
            regs[current] = int(m.group(1))
    return regs


def build(src: CudaSource, name: str, verbose: bool = False):
    """The compiled module (load_inline), its launchers bound by name. Needs torch, nvcc, a GPU."""
    check_source(src)
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    from torch.utils.cpp_extension import load_inline

    return load_inline(
        name=name,
        cpp_sources=[src.declarations],
        cuda_sources=[src.text],
        functions=src.functions,
        extra_cuda_cflags=NVCC_FLAGS,
        extra_cflags=["-O2"],
        verbose=verbose,
    )


class LaunchError(RuntimeError):
    """A kernel launch returned a CUDA error."""


def checked(module, launcher: str, *args) -> None:
    """Call a launcher and raise LaunchError on a non-zero cudaError_t."""
    err = getattr(module, launcher)(*args)
    if err:
        raise LaunchError(f"{launcher}: CUDA error {err}")
