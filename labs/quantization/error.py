"""python -m labs.quantization.error: weight, activation and method error on Llama-8B layer shapes (CPU, numpy).

    python -m labs.quantization.error --out out/quant            # every table, printed and written
    python -m labs.quantization.error --out out/quant --record   # ... and stored in labs/results/
    python -m labs.quantization.error --quick                    # small shapes, seconds

Four tables, each on synthetic matrices whose outliers labs/quantization/synthetic.py
states (and once more without them, which flatters every method):
- schemes: weight reconstruction error and layer output error for every format x
  granularity x symmetry on each Llama-3.1-8B projection shape;
- activations: per-tensor vs per-token int8 and fp8 on activations with outlier channels;
- smoothquant: W8A8 (per-tensor int8 activations, per-channel int8 weights) output error
  against SmoothQuant's alpha;
- methods: RTN, GPTQ and AWQ at int4 g128 on k_proj with a calibration set, error on
  held-out inputs.
Results are CPU-derived (seeded, deterministic); the page labels them so.
"""

from __future__ import annotations

import datetime
import platform
import sys
from pathlib import Path

import numpy as np

from labs import recorded
from labs.cli import Parser, output_dir
from labs.quantization import methods, synthetic
from labs.quantization.schemes import Scheme, fake_quant, rel_error

LAB = "quantization_error"
RESULTS_PATH = recorded.RESULTS_DIR / f"{LAB}.json"
MACHINE = recorded.Machine("CPU (numpy, derived)")
KEY = ("table", "case")

WEIGHT_SCHEMES = (
    *(Scheme(f, "tensor") for f in ("int8", "int4", "fp8-e4m3", "fp8-e5m2")),
    *(Scheme(f, "channel") for f in ("int8", "int4", "fp8-e4m3", "fp8-e5m2")),
    *(Scheme("int4", "group", g, sym) for g in (32, 64, 128) for sym in (True, False)),
    *(Scheme("int8", "group", 128, sym) for sym in (True, False)),
    Scheme("int4", "tensor", symmetric=False), Scheme("int4", "channel", symmetric=False),
)
ACT_SCHEMES = (Scheme("int8", "tensor"), Scheme("int8", "channel"), Scheme("fp8-e4m3", "tensor"),
               Scheme("fp8-e4m3", "channel"))
ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0)
METHOD_SCHEME = Scheme("int4", "group", 128)


def _sizes(quick: bool) -> dict:
    if quick:  # what the CPU tests run: the same code on (N/16, K/16)-sized layers
        return {"shapes": {"k_proj": (64, 256), "down_proj": (256, 896)}, "tokens": 256, "calib": 1024,
                "method_layer": "k_proj"}
    # the two attention shapes (o_proj is q_proj's, v_proj k_proj's): the MLP's 58.7M-weight matrices
    # behave the same per row and cost 3.5x as much CPU per scheme, so the lab leaves them out
    shapes = {name: synthetic.LLAMA_8B_SHAPES[name] for name in ("q_proj", "k_proj")}
    return {"shapes": shapes, "tokens": 512, "calib": 8192, "method_layer": "k_proj"}


def schemes_table(sizes: dict) -> list[dict]:
    rows = []
    for layer, (n, k) in sizes["shapes"].items():
        for gaussian in (False, True):
            w = synthetic.weights(n, k, gaussian=gaussian).astype(np.float32)
            x = synthetic.activations(sizes["tokens"], k, seed=3, gaussian=gaussian).astype(np.float32)
            y = x @ w.T
            for s in WEIGHT_SCHEMES:
                wq = fake_quant(w, s).astype(np.float32)
                rows.append({"case": f"{layer}-{s.name}-{'gaussian' if gaussian else 'outliers'}", "layer": layer,
                             "shape": [n, k], "scheme": s.name, "fmt": s.fmt, "granularity": s.granularity,
                             "group": s.group, "symmetric": s.symmetric, "bits_per_value": s.bits_per_value(),
                             "data": "gaussian" if gaussian else "outliers",
                             "weight_err": float(f"{rel_error(wq, w):.4g}"),
                             "output_err": float(f"{rel_error(x @ wq.T, y):.4g}")})
    return rows


def activations_table(sizes: dict) -> list[dict]:
    k = 4096 if "q_proj" in sizes["shapes"] else 256
    rows = []
    for gaussian in (False, True):
        x = synthetic.activations(sizes["tokens"], k, seed=4, gaussian=gaussian)
        bulk = np.setdiff1d(np.arange(k), synthetic.outlier_channels(k))
        for s in ACT_SCHEMES:
            xq = fake_quant(x, s)
            name = s.name.replace("per-channel", "per-token")  # rows of X are tokens
            rows.append({"case": f"{name}-{'gaussian' if gaussian else 'outliers'}", "scheme": name,
                         "data": "gaussian" if gaussian else "outliers", "k": k,
                         "err": float(f"{rel_error(xq, x):.4g}"),
                         "bulk_err": float(f"{rel_error(xq[:, bulk], x[:, bulk]):.4g}")})
    return rows


def smoothquant_table(sizes: dict) -> list[dict]:
    n, k = sizes["shapes"]["k_proj"]
    act, weight = Scheme("int8", "tensor"), Scheme("int8", "channel")
    rows = []
    for gaussian in (False, True):
        w = synthetic.weights(n, k, gaussian=gaussian)
        x = synthetic.activations(sizes["tokens"], k, seed=5, gaussian=gaussian)
        data = "gaussian" if gaussian else "outliers"
        cases = [("no smoothing", None), *((f"alpha={a}", a) for a in ALPHAS)]
        for label, alpha in cases:
            rows.append({"case": f"{label}-{data}", "alpha": alpha, "data": data,
                         "output_err": float(f"{methods.w8a8_output_error(x, w, act, weight, alpha):.4g}")})
        per_token = methods.w8a8_output_error(x, w, Scheme("int8", "channel"), weight)
        rows.append({"case": f"per-token activations-{data}", "alpha": None, "data": data,
                     "output_err": float(f"{per_token:.4g}")})
    return rows


def methods_table(sizes: dict) -> list[dict]:
    layer = sizes["method_layer"]
    n, k = sizes["shapes"][layer]
    rows = []
    for gaussian in (False, True):
        data = "gaussian" if gaussian else "outliers"
        w = synthetic.weights(n, k, gaussian=gaussian)
        calib = synthetic.activations(sizes["calib"], k, seed=11, gaussian=gaussian)
        test = synthetic.activations(sizes["tokens"], k, seed=12, gaussian=gaussian)
        w_awq, alpha = methods.awq(w, calib, METHOD_SCHEME)
        for name, w_hat in (("RTN", methods.rtn(w, METHOD_SCHEME)), ("GPTQ", methods.gptq(w, calib, METHOD_SCHEME)),
                            ("AWQ", w_awq)):
            rows.append({"case": f"{name}-{data}", "method": name, "data": data, "layer": layer, "shape": [n, k],
                         "scheme": METHOD_SCHEME.name, "calib_tokens": sizes["calib"],
                         "awq_alpha": alpha if name == "AWQ" else None,
                         "output_err": float(f"{methods.output_error(test, w, w_hat):.4g}"),
                         "weight_err": float(f"{rel_error(w_hat, w):.4g}")})
    return rows


TABLES = {"schemes": schemes_table, "activations": activations_table, "smoothquant": smoothquant_table,
          "methods": methods_table}


def run(quick: bool = False, log=print) -> list[dict]:
    sizes = _sizes(quick)
    rows = []
    for name, fn in TABLES.items():
        table = fn(sizes)
        for r in table:
            log(f"{name:<12} " + "  ".join(f"{k}={v}" for k, v in r.items() if k not in ("shape",)))
        rows += [{"table": name, "ok": True, **r} for r in table]
    return rows


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m labs.quantization.error", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=output_dir, metavar="DIR", help="folder to write the results JSON into")
    p.add_argument("--record", action="store_true", help=f"also merge the rows into labs/results/{RESULTS_PATH.name}")
    p.add_argument("--quick", action="store_true", help="small shapes (what the tests run); cannot be recorded")
    args = p.parse_args(argv)
    if args.record and args.quick:
        p.error("--record stores the full-size tables: run it without --quick")
    rows = run(args.quick)
    run_info = {"date": datetime.date.today().isoformat(), "numpy": np.__version__,
                "python": platform.python_version(), "quick": args.quick}
    targets = ([Path(args.out) / RESULTS_PATH.name] if args.out else []) + ([RESULTS_PATH] if args.record else [])
    for path in targets:
        path.parent.mkdir(parents=True, exist_ok=True)
        print(recorded.record_rows(path, LAB, MACHINE, rows, KEY, run_info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
