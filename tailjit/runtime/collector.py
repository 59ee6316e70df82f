"""Python's garbage collector while tailjit compiles: no full collections.

A compile builds many objects that stay in use until it ends (the traced graph and its fake tensors,
tensor expressions, memo tables).  They count towards CPython's next full collection, which walks the
whole heap (0.3 s once torch's modules and Inductor are loaded) and frees almost nothing, since the
compile still holds them: GAE over 128 steps spent a fifth of its compile in such collections.  So while
any compile runs, the oldest generation is not collected; the young ones still are (they free the
compile's short-lived cycles).  The full collection that falls due runs after the compile, as it would
have anyway, when the compile's objects are garbage it can free.  (Python 3.14's incremental collector
ignores the third threshold: there this changes nothing.)"""

from __future__ import annotations

import contextlib
import gc
import threading

#: The oldest generation's threshold while compiling: larger than any number of young collections.
_NEVER = 1 << 30

_lock = threading.Lock()
_depth = 0  # compiles running (nested or on other threads)
_saved: tuple[int, ...] | None = None  # the thresholds to restore, None when left alone


@contextlib.contextmanager
def full_collections_deferred():
    """Within this block (and any nested one, on any thread), no full collection starts."""
    global _depth, _saved
    with _lock:
        if _depth == 0:
            _saved = None
            old = gc.get_threshold()
            if old[0]:  # (a zero first threshold turns automatic collection off)
                _saved = old
                gc.set_threshold(old[0], old[1], _NEVER)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _saved is not None:
                now = gc.get_threshold()
                if now == (_saved[0], _saved[1], _NEVER):  # (thresholds set meanwhile are the caller's)
                    gc.set_threshold(*_saved)
                _saved = None
