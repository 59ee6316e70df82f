"""A differential fuzzer: random long-tail PyTorch programs run through eager PyTorch,
``torch.compile(backend="tailjit")`` and ``tailjit.jit``, forward and backward, compared value by value.

``programs.py`` draws programs (hypothesis), ``check.py`` runs one and compares, ``worker.py`` runs checks in a
subprocess (so a segfault or a hang is a finding, not the end of the run), ``campaign.py`` is ``tailjit fuzz``.
"""

import sys


def add_arguments(parser) -> None:
    """``tailjit fuzz``'s options (here, not in ``campaign``, so that the command line is built without
    hypothesis, an optional dependency that only a fuzz run needs)."""
    parser.add_argument("--minutes", type=float, default=10.0, help="time budget (default 10)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first round (default 0)")
    parser.add_argument("--out", default="fuzz-out", help="where reproducers go (default fuzz-out)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a program may take (default 120)")


def main(args) -> int:
    """``tailjit fuzz``: exit 2 with what to install where hypothesis is missing."""
    try:
        from tailjit.fuzz import campaign  # hypothesis is imported only by a fuzz run
    except ModuleNotFoundError as e:
        if e.name != "hypothesis":
            raise
        print('tailjit fuzz needs hypothesis: pip install hypothesis (or pip install -e ".[fuzz]")', file=sys.stderr)
        return 2
    return campaign.main(args)
