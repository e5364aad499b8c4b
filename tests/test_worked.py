"""labs/worked: the package the pages' worked examples come from.

Each topic module has its own test file (tests/test_worked_<topic>.py) that checks its
figures by hand; this one checks what every module owes the site build: it imports without
torch, lists its examples in EXAMPLES, and gives each a name no other macro has.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import ROOT
from labs import worked


def test_every_topic_lists_documented_examples_with_unique_names():
    found = list(worked.examples())
    assert found, "labs/worked holds no examples"
    names = [fn.__name__ for _, fn in found]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    for module, fn in found:
        assert callable(fn) and fn.__module__ == module, f"{module}: {fn!r} is not its own function"
        assert (fn.__doc__ or "").strip(), f"{module}.{fn.__name__} has no docstring"


def test_the_package_imports_without_torch():
    code = ("import sys; from labs import worked; list(worked.examples()); "
            "assert 'torch' not in sys.modules and 'triton' not in sys.modules")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_a_worked_example_cannot_take_the_name_of_another_macro(monkeypatch):
    """macros.py refuses a second registration of a name instead of letting one shadow the other."""
    pytest.importorskip("pydantic")  # macros.py reads vLLM's facts through it
    monkeypatch.syspath_prepend(str(ROOT))
    import macros

    fn = next(fn for _, fn in worked.examples())

    class Env:
        macros = {fn.__name__: object()}

        def macro(self, f):
            self.macros[f.__name__] = f

    with pytest.raises(macros.MacroError, match=f"worked example '{fn.__name__}'"):
        macros.register_worked_examples(Env())
