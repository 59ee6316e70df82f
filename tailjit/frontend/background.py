"""``tailjit.jit(fn, compile="background")``: a call never waits for a compile.

A call that nothing compiled serves hands a copy of its arguments to a thread that makes the compiled
function's call on them (tracing, lowering, gcc, loading), and runs ``fn`` eagerly itself; so does every such
call while that thread runs.  What the thread compiled then serves the calls of its signature (an entry added
to a dictionary, whole: a call sees eager or compiled, never half of it).  A compile that raises leaves eager
in place, and the next call warns once.  See ``docs/jit.md``, "Background compilation"."""

from __future__ import annotations

import functools
import threading
import warnings

import torch
import torch.utils._pytree as pytree

from tailjit.runtime.kernel import dispatch_modes, functorch_active

__all__ = ["Background", "COMPILE_MODES", "NOT_SERVED"]

#: ``tailjit.jit``'s ``compile`` argument: before the first call returns, or in a thread while calls run eagerly.
COMPILE_MODES = ("now", "background")

#: ``served``'s answer where what was compiled does not serve a call (a call would trace it).
NOT_SERVED = object()


class Background:
    """What ``tailjit.jit(fn, compile="background")`` returns: each call runs what ``compiled`` (what
    ``tailjit.jit(fn)`` returns) compiled where that serves it, else ``fn`` eagerly, and starts a compile of
    its signature in a thread of its own where none runs.  ``state`` says which runs and why; other
    attributes are ``compiled``'s (``entries``, ``reports``)."""

    def __init__(self, fn, compiled):
        if not isinstance(fn, torch.nn.Module):  # (a module's ``__dict__`` holds its parameters)
            functools.update_wrapper(self, fn)
        self.fn, self.compiled = fn, compiled
        self.compiles = 0  # background compiles done
        self.error: Exception | None = None  # why a background compile failed
        self.thread: threading.Thread | None = None  # the compile running, if any
        self._warned = False
        self._lock = threading.Lock()  # one call starts a compile

    def __call__(self, *args, **kwargs):
        if self.error is not None:
            self._warn_once()
            return self.fn(*args, **kwargs)
        if dispatch_modes() or functorch_active() or torch.compiler.is_compiling():
            return self.fn(*args, **kwargs)  # inside another trace, whose ops these join
        out = self.compiled.served(args, kwargs)
        if out is not NOT_SERVED:
            return out
        with self._lock:
            thread = None
            if self.thread is None:  # copies: the compiled call may write into its inputs, the caller change them
                args_, kwargs_ = _copied((args, kwargs))
                thread = self.thread = threading.Thread(
                    target=self._compile, args=(args_, kwargs_, torch.is_grad_enabled()), daemon=True
                )
        try:
            out = self.fn(*args, **kwargs)
        except BaseException:
            if thread is not None:  # a call that fails eagerly (a wrong argument) compiles nothing
                self.thread = None
            raise
        if thread is not None:
            thread.start()
        return out

    def _compile(self, args, kwargs, grad_enabled: bool) -> None:
        try:
            with torch.set_grad_enabled(grad_enabled):  # (thread-local: the caller's, as the signature says)
                self.compiled(*args, **kwargs)
            self.compiles += 1
        except Exception as err:  # noqa: BLE001 - whatever failed, eager stays; the next call says why
            self.error = err
        finally:
            self.thread = None

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
        """Wait for the background compile that runs, if any; True where none runs and none failed."""
        thread = self.thread
        if thread is not None and thread.ident is not None:
            thread.join(timeout)
        return self.thread is None and self.error is None

    @property
    def state(self) -> str:
        """Which version runs, and why."""
        if self.error is not None:
            return f"eager: the background compile failed ({type(self.error).__name__}: {self.error})"
        if self.thread is not None:
            return "eager: compiling in the background (calls that a compiled entry serves run compiled)"
        if self.compiles:
            choices = "".join(f"; eager as a candidate: {c}" for c in self.compiled.choices)
            return (
                f"compiled: {self.compiles} background compile(s) done (a new signature runs eagerly while it "
                f"compiles){choices}"
            )
        return "eager: not called yet (the first call starts a compile)"

    def __getattr__(self, name):
        if name.startswith("__") or "compiled" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.compiled, name)


def _copied(tree):
    """``tree`` with each tensor replaced by a copy of its own: of its whole storage, so strides, offsets and
    tensors that share memory stay as they were (a leaf that requires grad where the tensor did)."""
    storages: dict = {}

    def copy(x):
        if not isinstance(x, torch.Tensor):
            return x
        if x.layout is not torch.strided:
            return x.detach().clone().requires_grad_(x.requires_grad)
        storage = x.untyped_storage()
        key = storage.data_ptr()
        if key not in storages:
            storages[key] = storage.clone()
        y = x.new_empty(0).set_(storages[key], x.storage_offset(), x.size(), x.stride())
        return y.requires_grad_(x.requires_grad)

    return pytree.tree_map(copy, tree)
