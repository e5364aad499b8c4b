"""The Triton lab's benchmark: each kernel against its torch counterpart, checked before timed.

Memory-bound kernels (add, softmax) are reported in GB/s of the bytes they must move,
next to the copy bandwidth of the same run; the matmul in TFLOP/s. Everything here but
`run` is plain Python: the CPU tests feed it fake timings.
"""

from __future__ import annotations

from dataclasses import dataclass

from labs.gpu_harness.timing import Summary, gb_per_s

EXPERIMENTS = ("add", "softmax", "matmul")


@dataclass(frozen=True)
class Case:
    kernel: str  # "add", "softmax" or "matmul"
    shape: tuple[int, ...]  # (n,), (rows, cols) or (M, N, K)
    dtype: str  # torch dtype name

    @property
    def name(self) -> str:
        return f"{self.kernel}-" + "x".join(str(s) for s in self.shape) + f"-{self.dtype}"

    @property
    def element_bytes(self) -> int:
        return {"float32": 4, "bfloat16": 2, "float16": 2}[self.dtype]

    @property
    def bytes_moved(self) -> int:
        """Bytes the kernel must read and write at least once."""
        if self.kernel == "add":
            return 3 * self.shape[0] * self.element_bytes
        if self.kernel == "softmax":
            return 2 * self.shape[0] * self.shape[1] * self.element_bytes
        m, n, k = self.shape
        return (m * k + k * n + m * n) * self.element_bytes

    @property
    def flops(self) -> int:
        if self.kernel == "matmul":
            m, n, k = self.shape
            return 2 * m * n * k
        return 0


CASES = [
    Case("add", (1 << 28,), "float32"),
    Case("softmax", (32768, 1024), "bfloat16"),
    Case("softmax", (8192, 8192), "bfloat16"),
    Case("softmax", (2048, 32768), "bfloat16"),
    Case("matmul", (4096, 4096, 4096), "bfloat16"),
    Case("matmul", (8192, 8192, 8192), "bfloat16"),
    Case("matmul", (4000, 4000, 4000), "bfloat16"),
]

# Relative error against an fp32 torch result (||out - ref|| / ||ref||) below which a case passes.
MATCH_REL_ERR = {"float32": 1e-6, "bfloat16": 1e-2, "float16": 2e-3}


def row(case: Case, ours: Summary, torch_time: Summary, rel_err: float, torch_rel_err: float,
        copy_gb_s: float) -> dict:
    """One case's row: both times, their ratio, and GB/s (with the fraction of copy) or TFLOP/s."""
    r = {"case": case.name, "kernel": case.kernel, "shape": list(case.shape), "dtype": case.dtype,
         "time_us": round(ours.median_us, 2), "spread": round(ours.spread, 3),
         "torch_time_us": round(torch_time.median_us, 2),
         "time_vs_torch": round(ours.median_us / torch_time.median_us, 3),
         "rel_err": float(f"{rel_err:.3g}"), "torch_rel_err": float(f"{torch_rel_err:.3g}")}
    if case.flops:
        r["tflop_s"] = round(case.flops / ours.median_us / 1e6, 1)
        r["torch_tflop_s"] = round(case.flops / torch_time.median_us / 1e6, 1)
    else:
        r["gb_s"] = round(gb_per_s(case.bytes_moved, ours.median_us), 1)
        r["torch_gb_s"] = round(gb_per_s(case.bytes_moved, torch_time.median_us), 1)
        r["of_copy"] = round(r["gb_s"] / copy_gb_s, 3)
    return r


HEADER = (f"{'case':<32} {'time us':>9} {'torch us':>9} {'vs torch':>8} {'rate':>8} {'torch':>8} "
          f"{'unit':<7} {'of copy':>7} {'rel err':>8}")


def format_row(r: dict) -> str:
    if "tflop_s" in r:
        rate, trate, unit, of_copy = r["tflop_s"], r["torch_tflop_s"], "TFLOP/s", ""
    else:
        rate, trate, unit, of_copy = r["gb_s"], r["torch_gb_s"], "GB/s", f"{r['of_copy']:.3f}"
    return (f"{r['case']:<32} {r['time_us']:>9.1f} {r['torch_time_us']:>9.1f} {r['time_vs_torch']:>8.3f} "
            f"{rate:>8.1f} {trate:>8.1f} {unit:<7} {of_copy:>7} {r['rel_err']:>8.1e}")


def config_name(experiment: str, row: dict) -> str:
    """The recorded row key within an experiment: the case name."""
    return row["case"]


def printed(sections: dict) -> dict[str, str]:
    """The table run() prints, as text: stored with the results for pages to show."""
    rows = [r for name in EXPERIMENTS for r in sections.get(name, [])]
    return {"all": "\n".join([HEADER, *map(format_row, rows)])}


def _inputs(torch, case: Case):
    dtype = getattr(torch, case.dtype)
    g = torch.Generator(device="cuda").manual_seed(0)
    if case.kernel == "add":
        return [torch.randn(case.shape, device="cuda", dtype=dtype, generator=g) for _ in range(2)]
    if case.kernel == "softmax":
        return [4 * torch.randn(case.shape, device="cuda", dtype=dtype, generator=g)]
    m, n, k = case.shape
    return [torch.randn((m, k), device="cuda", dtype=dtype, generator=g),
            torch.randn((k, n), device="cuda", dtype=dtype, generator=g)]


def run(torch, time, copy_gb_s: float, experiments: tuple[str, ...], log=print) -> dict:
    """Check each case against an fp32 torch result, then time it and torch; returns {kernel: rows}."""
    from labs.triton_tutorial import kernels

    ours = {"add": kernels.add, "softmax": kernels.softmax, "matmul": kernels.matmul}
    theirs = {"add": torch.add, "softmax": lambda x: torch.softmax(x, dim=-1), "matmul": torch.matmul}
    sections = {}
    log(HEADER)
    for case in CASES:
        if case.kernel not in experiments:
            continue
        args = _inputs(torch, case)
        ref = theirs[case.kernel](*[a.float() for a in args])
        out, tout = ours[case.kernel](*args), theirs[case.kernel](*args)
        err = ((out.float() - ref).norm() / ref.norm()).item()
        terr = ((tout.float() - ref).norm() / ref.norm()).item()
        if not err <= MATCH_REL_ERR[case.dtype]:
            raise AssertionError(f"{case.name}: relative error {err:.3g} against fp32 torch "
                                 f"exceeds {MATCH_REL_ERR[case.dtype]} (torch itself: {terr:.3g})")
        del out, tout, ref
        t_ours = time(lambda: ours[case.kernel](*args))
        t_torch = time(lambda: theirs[case.kernel](*args))
        r = row(case, t_ours, t_torch, err, terr, copy_gb_s)
        log(format_row(r))
        sections.setdefault(case.kernel, []).append(r)
        del args
    return sections
