"""A differential fuzzer: random long-tail PyTorch programs run through eager PyTorch,
``torch.compile(backend="tailjit")`` and ``tailjit.jit``, forward and backward, compared value by value.

``programs.py`` draws programs (hypothesis), ``check.py`` runs one and compares, ``worker.py`` runs checks in a
subprocess (so a segfault or a hang is a finding, not the end of the run), ``campaign.py`` is ``tailjit fuzz``.
"""
