"""``tailjit.jit(fn, compile="background")``: eager calls until the compiled function is ready.

The first call hands a copy of its arguments to a thread that makes the compiled function's first call
(tracing, lowering, gcc, loading), and runs ``fn`` eagerly itself; so does every call until that thread is
done.  The compiled function then serves the calls (one attribute set: a call sees eager or compiled, never
half of it).  A compile that raises leaves eager in place, and the next call warns once.  See
``docs/jit.md``, "Background compilation"."""

from __future__ import annotations

import functools
import threading
import warnings

import torch
import torch.utils._pytree as pytree

from tailjit.runtime.kernel import dispatch_modes, functorch_active

__all__ = ["Background", "COMPILE_MODES"]

#: ``tailjit.jit``'s ``compile`` argument: before the first call returns, or in a thread while calls run eagerly.
COMPILE_MODES = ("now", "background")


class Background:
    """What ``tailjit.jit(fn, compile="background")`` returns: ``fn`` eagerly until ``compiled`` (what
    ``tailjit.jit(fn)`` returns) has made its first call in a thread of its own, then ``compiled``.
    ``state`` says which runs and why; other attributes are ``compiled``'s (``entries``, ``reports``)."""

    def __init__(self, fn, compiled):
        if not isinstance(fn, torch.nn.Module):  # (a module's ``__dict__`` holds its parameters)
            functools.update_wrapper(self, fn)
        self.fn, self.compiled = fn, compiled
        self.ready = False  # the compiled function serves the calls
        self.error: Exception | None = None  # why the background compile failed
        self.thread: threading.Thread | None = None  # the compile, once a call started it
        self._warned = False
        self._lock = threading.Lock()  # one call starts the compile

    def __call__(self, *args, **kwargs):
        if self.ready:
            return self.compiled(*args, **kwargs)
        if self.error is not None:
            self._warn_once()
            return self.fn(*args, **kwargs)
        if self.thread is not None or dispatch_modes() or functorch_active() or torch.compiler.is_compiling():
            return self.fn(*args, **kwargs)  # compiling, or inside another trace (whose ops these join)
        with self._lock:
            start = self.thread is None
            if start:  # copies: the compiled call may write into its inputs, and the caller may change them
                copies = _copied((args, kwargs))
                self.thread = threading.Thread(
                    target=self._compile, args=(*copies, torch.is_grad_enabled()), daemon=True, name="tailjit-compile"
                )
        try:
            out = self.fn(*args, **kwargs)
        except BaseException:
            if start:  # a call that fails eagerly (a wrong argument) compiles nothing
                self.thread = None
            raise
        if start:
            self.thread.start()
        return out

    def _compile(self, args, kwargs, grad_enabled: bool) -> None:
        try:
            with torch.set_grad_enabled(grad_enabled):  # (thread-local: the caller's, as the signature says)
                self.compiled(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - whatever failed, eager stays; the next call says why
            self.error = err
            return
        self.ready = True

    def _warn_once(self) -> None:
        with self._lock:
            if self._warned:
                return
            self._warned = True
        err = self.error
        warnings.warn(
            f"tailjit.jit: the background compile of {getattr(self.fn, '__qualname__', type(self.fn).__qualname__)} "
            f"failed ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); it runs eagerly",
            RuntimeWarning,
            stacklevel=3,
        )

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for a background compile that a call started; True where the compiled function now serves."""
        thread = self.thread
        if thread is not None and thread.ident is not None:
            thread.join(timeout)
        return self.ready

    @property
    def state(self) -> str:
        """Which version runs, and why."""
        if self.ready:
            return "compiled: the background compile is done"
        if self.error is not None:
            return f"eager: the background compile failed ({type(self.error).__name__}: {self.error})"
        if self.thread is not None:
            return "eager: compiling in the background (started by the first call)"
        return "eager: not called yet (the first call starts the compile)"

    def __getattr__(self, name):
        if name.startswith("__") or "compiled" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.compiled, name)


def _copied(tree):
    """``tree`` with each tensor replaced by a copy of its own (a leaf that requires grad where it did; one copy
    for a tensor passed twice)."""
    memo: dict = {}

    def copy(x):
        if not isinstance(x, torch.Tensor):
            return x
        if id(x) not in memo:
            memo[id(x)] = x.detach().clone().requires_grad_(x.requires_grad)
        return memo[id(x)]

    return pytree.tree_map(copy, tree)
