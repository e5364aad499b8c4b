"""Work around a Triton interpreter bug with NumPy >= 2.4, so the kernel runs on a CPU.

The interpreter holds every scalar as a one-element array and turns it into a Python int
with `int(array)` when a loop bound needs one (`range(start, end, TILE_N)` with `start`
loaded from memory). NumPy 2.4 made that conversion a TypeError
(https://numpy.org/doc/stable/release/2.4.0-notes.html). Triton fixed it upstream
(issue https://github.com/triton-lang/triton/issues/9171, PR #9172); Triton 3.6.0 does not
have the fix. This patch does the same conversion with `.item()`, and only where the
installed NumPy refuses the old one.
"""

from __future__ import annotations

import functools
import warnings


@functools.cache
def _numpy_refuses_1d_to_int() -> bool:
    """Asked once: NumPy 1.25-2.3 only warn (DeprecationWarning) where 2.4 raises."""
    import numpy as np

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            int(np.ones(1, dtype=np.int64))
        except TypeError:
            return True
    return False


def patch_interpreter_index() -> None:
    """Make interpreter tensors usable as loop bounds under NumPy >= 2.4. Idempotent."""
    from triton.runtime import interpreter

    if getattr(interpreter, "_labs_index_patched", False) or not _numpy_refuses_1d_to_int():
        return
    original = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    interpreter._patch_lang_tensor = patched
    interpreter._labs_index_patched = True
