"""Module-level constants read from a Python file's source, without importing it.

The site build has no Triton or torch, so it cannot import the lab kernel to quote its
RESIDENT_PROGRAMS, and a vLLM backend module pulls in GPU kernels on import; both still
have to be quoted exactly as their source assigns them.
"""

from __future__ import annotations

import ast
from pathlib import Path


def assigned_literals(path: str | Path, name: str) -> list:
    """The literal values `path` assigns to `name` at module level, in source order ([] if none)."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    return [node.value.value for node in tree.body
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
            and any(isinstance(target, ast.Name) and target.id == name for target in node.targets)]
