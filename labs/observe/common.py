"""What the three observe CLIs share: the engine flags and the engine they build, the --out/--record/--machine
flags and the write of their rows."""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

from labs import cli
from labs.recorded import RESULTS_DIR, Machine, RecordedError, record_rows, write_atomic

SCRAPE_FILE = RESULTS_DIR / "observe_metrics.json"
PROFILE_FILE = RESULTS_DIR / "observe_profile.json"
TUNE_FILE = RESULTS_DIR / "observe_tuning.json"


def add_engine_flags(p: cli.Parser) -> None:
    """--model, --tiny, --layers, --device: the engine that profile and tune drive."""
    p.add_argument("--model", default="llama-3.1-8b", help="a model of labs/data/models.yaml (random weights)")
    p.add_argument("--tiny", action="store_true", help="a tiny model of --model's recipe (for a CPU)")
    p.add_argument("--layers", type=cli.bounded_int(1, 1000), help="keep only the first N layers")
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when available")


def pick_device(p: cli.Parser, a) -> str:
    """--device, or cuda when one is visible; refuses --device cuda without a GPU."""
    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        cli.reject(p, "--device", "cuda was asked for and no CUDA GPU is visible")
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        torch.set_num_threads(1)  # a tiny model's steps are slower, not faster, on a shared thread pool
    return device


def open_engine(a, device: str, **engine):
    """The engine the flags ask for: Triton decode attention and CUDA graphs on a GPU. Raises ConfigError."""
    from labs.engine.config import ModelConfig
    from labs.engine.llm import LLM
    from labs.server.__main__ import TINY

    cfg = ModelConfig.from_spec(a.model).replace(**TINY) if a.tiny else None
    return LLM(a.model, model_config=cfg, n_layers=a.layers, device=device,
               decode_attention="triton" if device == "cuda" else "torch", cuda_graphs=device == "cuda", **engine)


def model_label(a) -> str:
    return f"{a.model} (tiny)" if a.tiny else a.model


def add_output_flags(p: cli.Parser, results: Path) -> None:
    p.add_argument("--out", type=cli.output_dir, required=True, help="folder for the rows (JSON)")
    p.add_argument("--record", action="store_true", help=f"merge the rows into labs/results/{results.name}")
    p.add_argument("--replace", action="store_true", help="with --record: let a failing row replace a passing one")
    p.add_argument("--machine", help="with --record: the GPU as CUDA names it (default: this machine's GPU)")


def check_output_flags(p: cli.Parser, a) -> None:
    if a.replace and not a.record:
        cli.reject(p, "--replace", "only with --record")
    if a.machine is not None and not a.machine.strip():
        cli.reject(p, "--machine", "expected a GPU name such as 'NVIDIA H200', got an empty string")


def machine_name(a, device: str) -> str:
    if a.machine:
        return a.machine.strip()
    if device == "cuda":
        import torch

        return torch.cuda.get_device_name(0)
    return "cpu"


def today() -> str:
    return datetime.datetime.now(datetime.timezone.utc).date().isoformat()


def write(a, name: str, rows: list[dict], results: Path, lab: str, key: tuple[str, ...], run: dict,
          machine: str) -> int:
    """rows -> OUT/name.json always; into the results file (through labs/recorded.py) with --record."""
    write_out(a, name, rows, run, machine)
    if not a.record:
        return 0
    if not rows:
        return cli.fail("nothing was measured; nothing recorded")
    try:
        report = record_rows(results, lab, Machine(machine), rows, key, run, replace=a.replace)
    except RecordedError as exc:
        return cli.fail(str(exc))
    print(report, file=sys.stderr)
    return 0


def write_out(a, name: str, rows: list[dict], run: dict, machine: str) -> None:
    Path(a.out).mkdir(parents=True, exist_ok=True)
    write_atomic(Path(a.out) / f"{name}.json", json.dumps({"machine": machine, "run": run, "rows": rows}, indent=1))
