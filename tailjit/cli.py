"""The ``tailjit`` command line."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tailjit", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    from tailjit.bench import cli as bench_cli

    bench = sub.add_parser("bench", help="run the long-tail benchmark suite")
    bench_cli.add_arguments(bench)
    bench.set_defaults(run=bench_cli.main)

    from tailjit import fuzz as fuzz_cli

    fuzz = sub.add_parser("fuzz", help="differential fuzzing against eager PyTorch (needs hypothesis)")
    fuzz_cli.add_arguments(fuzz)
    fuzz.set_defaults(run=fuzz_cli.main)

    from tailjit.tuner import cli as tune_cli

    tune = sub.add_parser("tune", help="search a program's schedules; list, export or import the tuning records")
    tune_cli.add_arguments(tune)
    tune.set_defaults(run=tune_cli.main)

    args = parser.parse_args(argv)
    return int(args.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
