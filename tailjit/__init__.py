"""tailjit: a compiler for long-tail deep-learning operators.

``tailjit.te`` defines operators as tensor expressions; :func:`build`
compiles them to fused C/OpenMP kernels callable on torch tensors and
numpy arrays.
"""

__version__ = "0.1.0"

from tailjit import te  # noqa: E402
from tailjit.api import build  # noqa: E402
from tailjit.runtime.compiler import CompileError, CompilerNotFound  # noqa: E402
from tailjit.te.expr import TEError  # noqa: E402

__all__ = ["te", "build", "TEError", "CompileError", "CompilerNotFound", "__version__"]
