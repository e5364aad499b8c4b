"""Start n worker processes under torch.distributed, bounded in time, and collect what they return.

One launcher for the TP check, the collectives benchmark and the tests, so
each has the same guarantees: the processes rendezvous through a file in a
fresh temporary folder (no TCP port to collide with another run), every
process group is created with a timeout, and the parent kills the workers
and raises after `timeout_s` instead of hanging. A hung rendezvous is the
classic multi-GPU failure (one rank never arrives), so the error says which
ranks did not finish.

A worker is a module-level function `fn(rank, world, backend, init_method, args) -> dict`;
its return value is written as JSON and handed back in rank order.
"""

from __future__ import annotations

import datetime
import json
import os
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable


class LaunchError(RuntimeError):
    """A worker raised, or the group did not finish in time; the message names the ranks."""


def init_group(backend: str, init_method: str, rank: int, world: int, timeout_s: float = 60.0):
    import torch.distributed as dist

    dist.init_process_group(backend=backend, init_method=init_method, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    return dist


def _entry(rank: int, fn: Callable, world: int, backend: str, init_method: str, args: Any, out_dir: str):
    out = Path(out_dir) / f"rank{rank}.json"
    try:
        if backend == "gloo":
            import torch

            torch.set_num_threads(1)  # ranks share the CPU; oversubscription only slows every rank
        result = fn(rank, world, backend, init_method, args)
        out.write_text(json.dumps({"ok": True, "result": result}))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, then re-raised
        out.write_text(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}",
                                   "traceback": traceback.format_exc()}))
        raise
    finally:
        try:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - teardown after a failure must not mask it
            pass


def run(fn: Callable, world: int, backend: str = "gloo", args: Any = None, timeout_s: float = 120.0) -> list[dict]:
    """Run `fn` on `world` spawned ranks; return each rank's result, rank 0 first."""
    import torch.multiprocessing as mp

    if world < 1:
        raise LaunchError(f"world size must be at least 1, got {world}")
    with tempfile.TemporaryDirectory(prefix="labs-parallel-") as tmp:
        init_method = f"file://{os.path.join(tmp, 'rendezvous')}"
        # CPU ranks fork (no second torch import: seconds per rank on a small CI machine; the
        # child runs single-threaded, so no OpenMP pool crosses the fork). CUDA cannot be forked.
        method = "fork" if backend == "gloo" and "fork" in mp.get_all_start_methods() else "spawn"
        ctx = mp.start_processes(_entry, args=(fn, world, backend, init_method, args, tmp), nprocs=world,
                                 join=False, start_method=method)
        deadline = time.monotonic() + timeout_s
        try:
            while not ctx.join(timeout=max(0.1, min(1.0, deadline - time.monotonic()))):
                if time.monotonic() > deadline:
                    raise LaunchError(_unfinished(tmp, world, timeout_s))
        except mp.ProcessRaisedException:
            raise LaunchError(_failures(tmp, world)) from None
        except mp.ProcessExitedException as exc:
            raise LaunchError(f"a rank exited early ({exc}); {_failures(tmp, world)}") from None
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                    p.join(5)
        results = []
        for rank in range(world):
            doc = json.loads((Path(tmp) / f"rank{rank}.json").read_text())
            results.append(doc["result"])
        return results


def _unfinished(tmp: str, world: int, timeout_s: float) -> str:
    done = sorted(int(p.stem[4:]) for p in Path(tmp).glob("rank*.json"))
    missing = [r for r in range(world) if r not in done]
    return (f"ranks {missing} of {world} did not finish within {timeout_s:.0f} s (a rendezvous or collective "
            f"that never completed: every rank must make the same collective calls in the same order)")


def _failures(tmp: str, world: int) -> str:
    lines = []
    for rank in range(world):
        path = Path(tmp) / f"rank{rank}.json"
        if path.is_file():
            doc = json.loads(path.read_text())
            if not doc["ok"]:
                lines.append(f"rank {rank}: {doc['error']}")
    return "; ".join(lines) or "a rank failed without reporting why"
