"""Macros for the site's pages (mkdocs-macros-plugin, `module_name: macros`).

Pages never type a number that a data file holds: they call these macros, which
read the same files the labs read (labs/data/*.yaml through labs.specs and
labs.kv_sizing) and the vLLM facts file. Link macros resolve through the bank
and raise on an unknown id, so a page cannot ship a dead link.

Layout: data loading, then small helpers, then `define_env` registering the
public macros. Nothing here imports torch.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "docs" / ".hooks"))
sys.path.insert(0, str(ROOT))

import bank as bank_lib  # noqa: E402
from bank_render import rel_link  # noqa: E402

# ---------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------

VLLM_FACTS = ROOT / "labs" / "data" / "vllm.yaml"


@functools.lru_cache(maxsize=1)
def _vllm_facts_cached(mtime_ns: int) -> dict[str, Any]:
    return yaml.safe_load(VLLM_FACTS.read_text(encoding="utf-8"))


def vllm_facts() -> dict[str, Any]:
    """The vLLM facts file, reread when it changes (mkdocs serve)."""
    return _vllm_facts_cached(VLLM_FACTS.stat().st_mtime_ns)


# ---------------------------------------------------------------------------
# Helper functions
# ---------------------------------------------------------------------------


class MacroError(ValueError):
    """A macro called with a name the data files do not hold."""


def num(value: float, digits: int = 0) -> str:
    """Thousands separators and a fixed number of decimals: 131072 -> '131,072'."""
    return f"{value:,.{digits}f}"


def kib(n_bytes: float, digits: int = 0) -> str:
    return f"{num(n_bytes / 1024, digits)} KiB"


def mib(n_bytes: float, digits: int = 1) -> str:
    return f"{num(n_bytes / 2**20, digits)} MiB"


def gib(n_bytes: float, digits: int = 1) -> str:
    return f"{num(n_bytes / 2**30, digits)} GiB"


def engine_arg(name: str) -> dict[str, Any]:
    args = vllm_facts()["engine_args"]
    if name not in args:
        raise MacroError(f"vLLM engine argument '{name}' is not in labs/data/vllm.yaml; known: {sorted(args)}")
    return args[name]


def default(name: str) -> Any:
    """The value vLLM uses when the flag is not given (the resolved default where one is recorded)."""
    arg = engine_arg(name)
    return arg["resolved"] if "resolved" in arg else arg["default"]


def _fmt_value(value: Any) -> str:
    if isinstance(value, bool):
        return str(value)  # Python spelling, as vLLM's Python API takes it
    return "None" if value is None else str(value)


def flag(name: str) -> str:
    """`--flag` (default X, vLLM 0.33), from the facts file."""
    arg = engine_arg(name)
    version = vllm_facts()["version"]
    return f"`{arg['flag']}` (default `{_fmt_value(default(name))}` in vLLM {version})"


# ---------------------------------------------------------------------------
# Macros
# ---------------------------------------------------------------------------


def define_env(env):
    def _page_uri() -> str:
        return env.page.file.src_uri

    def _bank() -> bank_lib.Bank:
        return bank_lib.get_bank(ROOT)

    @env.macro
    def lesson(lesson_id: str, text: str | None = None) -> str:
        """A link to a lesson by id (part-N/<slug>), titled with the lesson's title."""
        found = _bank().lessons.get(lesson_id)
        if found is None:
            raise MacroError(f"lesson('{lesson_id}'): no docs/lessons/{lesson_id}.md")
        return f"[{text or found.meta.title}]({rel_link(_page_uri(), found.src_uri)})"

    @env.macro
    def question(slug: str, text: str | None = None) -> str:
        """A link to a bank question by slug, titled with the question."""
        found = _bank().questions.get(slug)
        if found is None:
            raise MacroError(f"question('{slug}'): no questions/part-N/{slug}.yaml")
        return f"[{text or found.q.title}]({rel_link(_page_uri(), found.src_uri)})"

    @env.macro
    def page_link(uri: str, text: str) -> str:
        """A link to a hand-written page by its path under docs/, checked to exist."""
        if not (ROOT / "docs" / uri).is_file():
            raise MacroError(f"page_link('{uri}'): docs/{uri} does not exist")
        return f"[{text}]({rel_link(_page_uri(), uri)})"

    env.macro(flag)
    env.macro(default)
    env.macro(lambda: vllm_facts()["version"], "vllm_version")
    env.macro(lambda name: _specs().get_model(name), "model")
    env.macro(lambda name: _specs().get_gpu(name), "gpu")
    env.macro(kv_bytes_per_token)
    env.macro(bytes_per_block)
    for fn in (num, kib, mib, gib):
        env.macro(fn)
        env.filter(fn)


# ---------------------------------------------------------------------------
# Lab-backed numbers (labs.specs and labs.kv_sizing are torch-free)
# ---------------------------------------------------------------------------


def _specs():
    import labs.specs

    return labs.specs


def kv_bytes_per_token(model_name: str, kv_dtype: str = "auto") -> int:
    """KV-cache bytes per token of a model from labs/data/models.yaml (the KV-sizing lab's formula)."""
    from labs.kv_sizing.formula import kv_bytes_per_token as formula

    return formula(_specs().get_model(model_name), kv_dtype)


def bytes_per_block(model_name: str, block_size: int | None = None, kv_dtype: str = "auto") -> int:
    from labs.kv_sizing.formula import bytes_per_block as formula

    size = block_size if block_size is not None else default("block_size")
    return formula(_specs().get_model(model_name), size, kv_dtype)

