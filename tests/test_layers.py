"""The import layers of issue 42: a developer running pytest sees a broken contract as CI's lint-imports does."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _env() -> dict:
    # the checkout under test, not whichever tailjit an editable install points at
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def test_import_contracts_are_kept():
    pytest.importorskip("importlinter")
    exe = shutil.which("lint-imports", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    if exe is None:
        pytest.skip("import-linter is installed without its lint-imports command")
    done = subprocess.run(
        [exe, "--no-cache", "--no-logo", str(ROOT / "pyproject.toml")],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_compiler_does_not_import_the_benchmark_suite():
    script = (
        "import sys, tailjit, tailjit.frontend\n"
        "print(tailjit.__file__)\n"
        "print(sorted(m for m in sys.modules if m == 'tailjit.bench' or m.startswith('tailjit.bench.')))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], env=_env(), capture_output=True, text=True, check=True)
    where, loaded = done.stdout.splitlines()
    assert Path(where).resolve() == ROOT / "tailjit" / "__init__.py"
    assert loaded == "[]"


def test_importing_the_lowering_registry_registers_every_op_family():
    """The registry (``lower.lowering``) imports no op family, which import it: the ``lower`` package does, so
    that a planner or a training check that reads ``LOWERINGS`` never sees part of it.  Importing every module
    of the package afterwards registers nothing more."""
    script = (
        "import pkgutil, importlib\n"
        "from tailjit.frontend.lower.lowering import LOWERINGS\n"
        "import tailjit.frontend.lower as lower\n"
        "first = {fn.__module__ for fn in LOWERINGS.values()}\n"
        "for m in pkgutil.iter_modules(lower.__path__):\n"
        "    importlib.import_module(f'{lower.__name__}.{m.name}')\n"
        "print(sorted(first))\n"
        "print(sorted({fn.__module__ for fn in LOWERINGS.values()}))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], env=_env(), capture_output=True, text=True, check=True)
    first, everything = done.stdout.splitlines()
    assert first == everything
    assert "tailjit.frontend.lower.pointwise" in first
