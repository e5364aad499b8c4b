"""Calling a lab CLI's main(argv) in-process, as a user's shell would run it, but safely.

CUDA is hidden (a bad value must be refused before the GPU is looked for), and
the call runs under a time limit and an address-space cap, so a bad value that a
CLI fails to refuse cannot start a long or a large run on the test machine.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import re
import signal
from pathlib import Path
from unittest import mock

from conftest import ROOT

LABS = ROOT / "labs"
GUARD = re.compile(r"""^if __name__ == ["']__main__["']:""", re.M)
TIME_LIMIT_S = 20


def load_main(module: str):
    """The CLI's main(argv), imported without running it; (None, why) when it cannot be."""
    target = module
    init = LABS.parent / (module.replace(".", "/") + "/__main__.py")
    if init.is_file():
        text = init.read_text(encoding="utf-8")
        if GUARD.search(text):
            target = module + ".__main__"
        else:  # `__main__.py` runs at import: take `main` from where it imports it
            found = re.search(r"^from ([\w.]+) import main\b", text, re.M)
            if not found:
                return None, f"{module}/__main__.py runs at import and names no main(argv) to call"
            target = found.group(1)
    try:
        mod = importlib.import_module(target)
    except ImportError as exc:  # e.g. torch missing in a site-only install
        return None, f"{module} cannot be imported here: {exc}"
    if not hasattr(mod, "main"):
        return None, f"{target} has no main(argv)"
    return mod.main, None


class TimedOut(Exception):
    pass


MEMORY_CAP = 3 * 2**30  # address space a refused argument may add before the run is stopped


def _memory_cap():
    """Cap further address space (Linux); a CLI that starts real work on a bad value fails, not the machine."""
    try:
        import resource

        vm = next(int(line.split()[1]) * 1024 for line in Path("/proc/self/status").read_text().splitlines()
                  if line.startswith("VmSize:"))
    except (ImportError, OSError, StopIteration):
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def cap():
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = vm + MEMORY_CAP if hard == resource.RLIM_INFINITY else min(hard, vm + MEMORY_CAP)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
        try:
            yield
        finally:
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))

    return cap()


def run_main(cli: str, argv: list[str]) -> tuple[int, str, str]:
    """Call the CLI's main(argv) with CUDA hidden, a time limit and a memory cap; (exit code, stdout, stderr)."""
    main, _ = load_main(cli)
    out, err = io.StringIO(), io.StringIO()

    def alarm(signum, frame):
        raise TimedOut

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, TIME_LIMIT_S)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), _no_cuda(), _memory_cap():
            try:
                code = main(argv)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                if not isinstance(exc.code, (int, type(None))):
                    err.write(f"{exc.code}\n")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    return (0 if code is None else code), out.getvalue(), err.getvalue()


@contextlib.contextmanager
def _no_cuda():
    with mock.patch.dict(os.environ, {"CUDA_VISIBLE_DEVICES": ""}):
        try:
            import torch
        except ImportError:
            yield
            return
        with mock.patch.object(torch.cuda, "is_available", lambda: False):
            yield


def one_line(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]
