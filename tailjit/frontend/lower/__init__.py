"""Lowering ATen nodes to tensor expressions: the registry and its helpers (``lowering``), one module per op
family, and what the planner and the training route share with them.  Importing the package registers every
family's lowerings."""

from tailjit.frontend.lower import index, pointwise, reduce, scan, scatter, view  # noqa: F401
