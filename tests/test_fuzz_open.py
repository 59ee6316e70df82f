"""Programs `tailjit fuzz` found where an entry still differs from eager, kept as the fuzzer wrote them
(`tests/fuzz_open/`, each runnable with `python`).  Each is an expected failure, strictly: a fix makes its
case pass, and the strict mark then fails the run until the file moves into a regression test."""

import runpy
from pathlib import Path

import pytest

from tailjit.fuzz.check import check_fn

OPEN = sorted((Path(__file__).parent / "fuzz_open").glob("*.py"))


@pytest.mark.xfail(strict=True, reason="an open bug found by the fuzzer (the file's header says which)")
@pytest.mark.parametrize("path", OPEN, ids=[p.stem for p in OPEN])
def test_open_fuzz_finding(path):
    program = runpy.run_path(str(path))
    failures = check_fn(program["fn"], program["make_inputs"], program["TOLERANCE"])
    assert not failures, "\n".join(f"{f.entry}: {f.kind}: {f.message}" for f in failures)
