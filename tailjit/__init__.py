"""tailjit: a compiler for long-tail deep-learning operators.

``tailjit.te`` defines operators as tensor expressions; :func:`build`
compiles them to fused C/OpenMP kernels callable on torch tensors and
numpy arrays.  ``torch.compile(fn, backend="tailjit")`` and ``tailjit.jit(fn)``
compile PyTorch functions; ``tailjit.explain(fn, *args)`` shows what they made.
"""

from tailjit import te
from tailjit.api import build
from tailjit.op import op
from tailjit.runtime.cachefiles import CacheWarning
from tailjit.runtime.compiler import CompileError, CompilerNotFound
from tailjit.te.expr import TEError
from tailjit.version import __version__

__all__ = [
    "te",
    "build",
    "op",
    "jit",
    "explain",
    "frontend",
    "tune",
    "TEError",
    "CompileError",
    "CompilerNotFound",
    "CacheWarning",
    "__version__",
]


def __getattr__(name: str):
    # The frontend imports torch._dynamo (seconds): load it on first use.
    # torch.compile(backend="tailjit") finds it through the package's entry point.
    if name in ("frontend", "jit", "explain"):
        import importlib

        frontend = importlib.import_module("tailjit.frontend")
        return frontend if name == "frontend" else getattr(frontend, name)
    if name == "tune":  # the tuner builds on the API and the suite's timing: imported on first use
        import importlib

        return importlib.import_module("tailjit.tuner.search").tune
    raise AttributeError(f"module 'tailjit' has no attribute {name!r}")
