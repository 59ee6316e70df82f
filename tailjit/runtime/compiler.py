"""The system C compiler, its flags, and the on-disk kernel cache.

Flags and why:

* ``-O2 -fvect-cost-model=dynamic -march=native``: vectorisation for this CPU
  (so the CPU is in the key). ``-O3``'s vectorisation decisions (its cost
  model, which also vectorises loops that need a peeled prologue or epilogue)
  without its other loop passes: those made no kernel measured faster and
  cost gcc time on large units (GAE unrolled over 128 steps: 10.0 s at
  ``-O3``, 6.9 s here); with ``-O2``'s default "very cheap" model softmax ran
  7% slower (interleaved, 2 threads, 4096 x 1024);
* ``-mprefer-vector-width=512``: on a CPU with AVX-512, use 512-bit vectors (gcc's
  tuning default stays at 256 bits); torch's own kernels use AVX-512 there, and a
  vectorised ``expf`` or division does twice the work per instruction.  No effect
  on a CPU without AVX-512;
* ``-fopenmp``: parallel loops and ``omp simd``; links libgomp, which torch's
  wheel already loaded, so one OpenMP runtime lives in the process;
* ``-fno-math-errno``: math calls may vectorise (libmvec, ``-lmvec``) and
  ``sqrt`` inlines; errno is never read;
* ``-fno-trapping-math``: lets conditional code if-convert; we never enable FP traps;
* ``-ffp-contract=off``: no fused multiply-add, so results round like eager PyTorch;
* ``-fwrapv``: integer overflow wraps as in PyTorch instead of being undefined;
* ``-Werror=invalid-pch``: a precompiled prelude that gcc rejects fails the compile, which is then done
  without it and the prelude rebuilt (gcc would otherwise parse its text in every compile, unseen).

No ``-ffast-math``: NaN, inf and signed zeros keep IEEE semantics.

With gcc, a library is linked by ``ld`` itself, with gcc's own link command less what the process has
already and the C library's linker script (``_direct_link``).

Cache layout: ``<cache>/<key[:2]>/<key>.{c,so,sha256,lock}``.  The key hashes
the source, the full command, the compiler's version, the CPU, the Python ABI
and tailjit's version.  A build holds the key's file lock, writes in a
temporary folder of its own and renames, so concurrent processes agree; the
``.sha256`` sidecar detects a truncated or corrupt library, and a library the
loader rejects is rebuilt too.  Which cache folders and entries are trusted:
``cachefiles``.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import functools
import hashlib
import importlib.machinery
import importlib.util
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from tailjit.codegen import ENTRY_MARK, KERNEL_MARK, PRELUDE_END, PYTHON_END, SHARED_MARK
from tailjit.runtime.cachefiles import (
    CacheRefused,
    cache_dir,
    forget,
    give_up,
    locked,
    make_folder,
    owned,
    place,
    publish,
    trusted_folder,
    valid,
)
from tailjit.runtime.capi import RUNTIME_SOURCE
from tailjit.runtime.objects import runtime_objects
from tailjit.version import __version__

PLACEHOLDER = "TJ_MODULE_NAME"


class CompilerNotFound(RuntimeError):
    pass


class CompileError(RuntimeError):
    pass


@dataclass(frozen=True)
class Toolchain:
    cc: str
    version: str
    flags: tuple[str, ...]
    libs: tuple[str, ...]
    #: the linker run directly (``_direct_link``), its objects and output marked by ``OBJECTS`` and
    #: ``OUTPUT``; None: the compiler driver links
    link: tuple[str, ...] | None = None


@functools.cache
def _toolchain(cc: str) -> Toolchain:
    path = shutil.which(cc)
    if path is None:
        raise CompilerNotFound(
            f"tailjit needs a C compiler and found none (looked for {cc!r}). "
            "Install gcc (Debian/Ubuntu: apt-get install gcc; Fedora: dnf install gcc) "
            "or point the CC environment variable at one."
        )
    try:
        proc = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    except OSError as e:
        raise CompilerNotFound(f"the C compiler {path!r} could not be run: {e}") from e
    version = (proc.stdout or proc.stderr).splitlines()[0] if (proc.stdout or proc.stderr) else "unknown"
    flags = [
        "-O2", "-fvect-cost-model=dynamic", "-march=native", "-mprefer-vector-width=512",
        "-fPIC", "-shared", "-std=gnu11", "-fopenmp",
        "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off", "-fwrapv",
        "-Wno-unused-variable", "-Wno-unused-function", "-Werror=invalid-pch",
        f"-I{sysconfig.get_paths()['include']}",
    ]  # fmt: skip
    flags += _gather_flag(path)
    libs = ["-lm"]
    if ctypes.util.find_library("mvec"):
        flags.append("-DTJ_MVEC")
        libs.insert(0, "-lmvec")
    return Toolchain(path, version, tuple(flags), tuple(libs), _direct_link(path, flags, libs))


def _gather_flag(cc: str) -> list[str]:
    """``-mtune-ctrl=use_gather`` where the compiler takes it: gcc 12 tunes vector gathers off for Intel
    server cores (Cooper Lake here), and a loop with one gather (a load at a computed index) then stays
    scalar, its ``exp`` calls included.  Remembered once the compiler took it (the probe, a compile, took
    16 ms of every process's start)."""
    try:
        identity = "\0".join([cc, str(os.stat(cc).st_mtime_ns)])
    except OSError:
        return []

    def takes_it() -> bool:
        with tempfile.TemporaryDirectory() as d:
            src = Path(d) / "probe.c"
            src.write_text("int tj_probe(void) { return 0; }\n")
            try:
                command = [cc, "-mtune-ctrl=use_gather", "-c", str(src), "-o", str(Path(d) / "probe.o")]
                return subprocess.run(command, capture_output=True, timeout=60).returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                return False

    return ["-mtune-ctrl=use_gather"] if _remembered("gather", identity, takes_it) else []


def _remembered(kind: str, identity: str, probe) -> bool:
    """Whether ``probe()`` passes for this toolchain ``identity``; a pass is remembered beside the precompiled
    prelude, so that later processes skip the probe (a failure is probed again: it may have been transient)."""
    passed = cache_dir() / "pch" / f"{kind}-{hashlib.sha256(identity.encode()).hexdigest()[:24]}.ok"
    with contextlib.suppress(CacheRefused):  # someone else's: probed again
        if owned(passed):
            return True
    if not probe():
        return False
    try:
        make_folder(passed.parent)
        passed.touch(mode=0o600)
    except OSError:
        pass  # a read-only cache: probe again next time
    return True


OBJECTS, OUTPUT = "TJ_OBJECTS.o", "TJ_OUTPUT.so"

#: How gcc's link names the C library, and what a direct link names instead: its shared object alone, not
#: the linker script around it (its static helpers, which kernels do not call, and the dynamic loader).  Still
#: linked, so that references carry their symbol versions: an unversioned ``memcpy`` would bind glibc's
#: first, SSE2 copy of 2002, kept for old binaries.
LIBC, LIBC_OBJECT = "-lc", "-l:libc.so.6"

#: What gcc links that the process a library is loaded into has already, and kernels do not need of their
#: own: the thread library (part of the C library since glibc 2.34, and only libgomp uses threads) and
#: libgcc's shared part (unwinding).
PROCESS_LIBS = ("-lpthread", "-lgcc_s")

#: A probe library's use of what kernels call: the C library, libm, libgomp.
LINK_PROBE = """
double exp(double);
void *malloc(unsigned long);
void free(void *);
int omp_get_max_threads(void);
double tj_probe(double x) {
  double *p = malloc(sizeof *p);
  if (!p) return -1;
  *p = exp(x) + omp_get_max_threads();
  x = *p;
  free(p);
  return x;
}
"""


def _direct_link(cc: str, flags: list[str], libs: list[str]) -> tuple[str, ...] | None:
    """gcc's own link of a kernel library (``cc -###``), run as the linker itself, without ``PROCESS_LIBS``
    and with the C library's shared object alone: pairwise IoU's two objects linked in 18 ms through the
    driver (``collect2``, then ``ld`` reading the C library's linker script), 11 ms so.  None where the
    compiler is not gcc, or a probe library linked so does not load.  A command that passed the probe is
    remembered beside the precompiled prelude (the probe took 40 ms of every process's start)."""
    try:
        ld = subprocess.run([cc, "-print-prog-name=ld"], capture_output=True, text=True, timeout=60)
        plan = subprocess.run([cc, *flags, "-###", OBJECTS, "-o", OUTPUT, *libs],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [shlex.split(ln) for ln in plan.stderr.splitlines() if "collect2" in ln]
    linker = shutil.which(ld.stdout.strip())
    if linker is None or plan.returncode != 0 or len(lines) != 1:
        return None
    command = [linker]
    args = iter(lines[0][1:])
    for arg in args:
        if arg == "-plugin":  # the LTO plugin: kernels are not LTO objects
            next(args, None)
        elif not arg.startswith("-plugin-opt") and arg not in PROCESS_LIBS:
            command.append(LIBC_OBJECT if arg == LIBC else arg)
    identity = "\0".join([*command, str(os.stat(linker).st_mtime_ns), cpu_id()])
    return tuple(command) if _remembered("link", identity, lambda: _links_and_loads(cc, command)) else None


def _links_and_loads(cc: str, command: list[str]) -> bool:
    """Whether ``command`` links a probe library (``LINK_PROBE``) that loads and computes."""
    with tempfile.TemporaryDirectory() as d:
        src, obj, so = Path(d) / "probe.c", Path(d) / "probe.o", Path(d) / "probe.so"
        src.write_text(LINK_PROBE)
        try:
            for step in ([cc, "-fPIC", "-c", str(src), "-o", str(obj)], _with_files(command, [obj], so)):
                if subprocess.run(step, capture_output=True, timeout=60).returncode != 0:
                    return False
            probe = ctypes.CDLL(str(so)).tj_probe  # binds every symbol now: a missing one fails here
        except (OSError, AttributeError, subprocess.TimeoutExpired):
            return False
        probe.restype, probe.argtypes = ctypes.c_double, [ctypes.c_double]
        return probe(0.0) >= 2.0  # exp(0) and at least one thread


def toolchain() -> Toolchain:
    return _toolchain(os.environ.get("CC", "gcc"))


@functools.lru_cache(maxsize=1)
def cpu_id() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    keep = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags", "Features", "CPU part"))]
    return hashlib.sha256("\n".join(sorted(set(keep))).encode()).hexdigest()[:16] + platform.machine()


def cache_key(source: str, tc: Toolchain) -> str:
    parts = [
        source,
        tc.cc,
        *tc.flags,
        *tc.libs,
        *(tc.link or ()),
        tc.version,
        cpu_id(),
        sys.implementation.cache_tag,
        __version__,
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


@dataclass
class BuildInfo:
    key: str
    path: Path
    seconds: float  # time spent compiling (0 when the cache had it)
    cache: str  # "memory", "disk" or "compiled"


_loaded: dict[str, ModuleType] = {}


def load(source: str) -> tuple[ModuleType, BuildInfo]:
    """Compile (or fetch from the caches) ``source`` and import it as an extension module.

    ``source`` names its module ``TJ_MODULE_NAME``; the cache key decides the real name."""
    tc = toolchain()
    key = cache_key(source, tc)
    mod = _loaded.get(key)
    if mod is not None:
        return mod, BuildInfo(key, cache_dir() / key[:2] / f"{key}.so", 0.0, "memory")
    helpers = api()  # before the kernel's own compile: a first build of the runtime is not the kernel's time
    mod, info = _build_cached(source, key[:2], key, f"tj_{key[:24]}", tc)
    mod.init(helpers)
    _loaded[key] = mod
    return mod, info


def load_runtime(source: str) -> ModuleType:
    """The runtime module (its source: ``tailjit.runtime.capi``), built once per toolchain beside the prelude's
    precompiled header: like it, a cost of the toolchain, not of any kernel."""
    tc = toolchain()
    key = cache_key(source, tc)
    return _build_cached(source, "pch", key, f"tj_runtime_{key[:16]}", tc)[0]


@functools.lru_cache(maxsize=1)
def runtime():
    """This process's runtime module, built on first use."""
    module = load_runtime(RUNTIME_SOURCE)
    module.init(*runtime_objects())
    if _forked:
        module.forked()
    return module


@functools.lru_cache(maxsize=1)
def api():
    """The helper table (a capsule) of this process's runtime module."""
    return runtime().api()


_forked = False  # this process was forked: its runtime module, once loaded, runs kernels on one thread


def _after_fork_in_child() -> None:
    """A forked child: the parent's OpenMP threads are gone, and libgomp would wait for them (eager
    PyTorch hangs too); the runtime's parallel helper runs kernels on one thread from now on."""
    global _forked
    _forked = True
    if runtime.cache_info().currsize:
        runtime().forked()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _build_cached(source: str, sub: str, key: str, name: str, tc: Toolchain) -> tuple[ModuleType, BuildInfo]:
    """``_build`` in the cache's folder ``sub``, or, where the cache refuses an entry or cannot be written,
    in this process's private folder (``cachefiles.give_up``)."""
    root = cache_dir()
    try:
        return _build(source, root / sub, key, name, tc)
    except (OSError, CacheRefused) as e:
        if not give_up(root, e):
            raise
    return _build(source, cache_dir() / sub, key, name, tc)


def _build(source: str, folder: Path, key: str, name: str, tc: Toolchain) -> tuple[ModuleType, BuildInfo]:
    """Import ``<folder>/<key>.so`` as module ``name``, compiling ``source`` first unless a valid
    library that loads is there (under the key's file lock, so concurrent processes compile once)."""
    so = folder / f"{key}.so"
    trusted_folder(folder)
    unloadable = False
    if valid(so):
        try:
            return _import(name, so), BuildInfo(key, so, 0.0, "disk")
        except ImportError:
            unloadable = True  # its checksum matches, yet the loader rejects it: rebuilt below
    make_folder(folder)  # again: it may have been removed since
    with locked(folder / f"{key}.lock"):
        seconds = 0.0
        if unloadable or not valid(so):
            seconds = _compile(source.replace(PLACEHOLDER, name), folder, key, tc)
        mod = _import(name, so)
    return mod, BuildInfo(key, so, seconds, "compiled" if seconds else "disk")


def _precompiled_prelude(prelude: str, tc: Toolchain) -> Path | None:
    """A header holding a prelude (the shared one, Python.h and the math helpers, or its part after
    Python's headers, for units of kernels alone), with its precompiled ``.gch`` beside it, built once
    per toolchain: parsing Python.h is most of a small kernel's compile time.  None when gcc cannot
    precompile it, or it cannot be written (a read-only cache, ``pch`` removed meanwhile): the unit then
    holds the prelude's text."""
    digest = hashlib.sha256("\0".join([prelude, tc.cc, *tc.flags, tc.version, cpu_id()]).encode()).hexdigest()[:24]
    try:
        folder = trusted_folder(cache_dir() / "pch")
        header = folder / f"prelude-{digest}.h"
        gch = header.with_name(header.name + ".gch")
        if valid(gch) and owned(header):
            return header
        make_folder(folder)
        with locked(folder / f"prelude-{digest}.lock"):
            if valid(gch) and owned(header):
                return header
            with tempfile.TemporaryDirectory(prefix=f"prelude-{digest}.tmp", dir=folder) as tmp:
                tmp_h, tmp_gch = Path(tmp) / header.name, Path(tmp) / gch.name
                tmp_h.write_text(prelude)
                place(tmp_h, header)
                flags = [f for f in tc.flags if f != "-shared"]
                try:
                    _run([tc.cc, *flags, "-x", "c-header", str(header), "-o", str(tmp_gch)])
                except CompileError:
                    return None
                publish(tmp_gch, gch)
                return header
    except OSError:
        return None


def _compile(source: str, folder: Path, key: str, tc: Toolchain) -> float:
    """Compile ``source`` to ``<folder>/<key>.so``, its C kept beside as ``<key>.c``.  The work is done in a
    temporary folder of its own (mode 0700, a name no one can guess: nothing planted there is written
    through), removed whatever happens (a failure, Ctrl-C)."""
    prelude, marker, body = source.partition(PRELUDE_END)
    units = split_units(body) if marker else None
    texts = list(units or [body])
    c_path = folder / f"{key}.c"
    with tempfile.TemporaryDirectory(prefix=f"{key}.tmp", dir=folder) as tmp:
        so, c = Path(tmp) / f"{key}.so", Path(tmp) / f"{key}.c"
        inline = [prelude + marker] * 2
        kernels = prelude.partition(PYTHON_END)[2] if units is not None and PYTHON_END in prelude else None
        headers = _prelude_headers(prelude, kernels, tc) if marker else []
        heads = [f'#include "{h}"\n' for h in headers] or inline
        start = time.perf_counter()
        try:
            try:
                _translate([h + t for h, t in zip(heads, texts)], so, tc)
            except CompileError:
                if not headers:
                    raise
                # the precompiled prelude vanished (``pch`` removed meanwhile) or gcc rejects it: the unit
                # is compiled with the prelude's text, and the prelude built anew by the next compile
                _translate([h + t for h, t in zip(inline, texts)], so, tc)
                for h in headers:
                    forget(h.with_name(h.name + ".gch"))
        except CompileError as e:
            c.write_text(inline[0] + body)
            place(c, c_path)
            raise CompileError(
                f"the C compiler failed on generated code ({c_path}); this is a tailjit bug, please report it.\n{e}"
            ) from None
        seconds = time.perf_counter() - start
        c.write_text(heads[0] + body)
        place(c, c_path)
        publish(so, folder / f"{key}.so")
    return max(seconds, 1e-9)


def _prelude_headers(prelude: str, kernels: str | None, tc: Toolchain) -> list[Path]:
    """The precompiled preludes the (first, second) unit include: the second, of kernels alone, the prelude's
    part ``kernels`` where given; none where the shared one cannot be had."""
    header = _precompiled_prelude(prelude, tc)
    if header is None:
        return []
    return [header, (_precompiled_prelude(kernels, tc) if kernels else None) or header]


#: A unit whose kernels hold at least this much C (two or more) is compiled as two translation units of
#: balanced kernel text at once, when the process may use two cores: gcc's time is in the kernels' loops
#: (the backward of pairwise IoU, 13 loop nests, takes about 0.4 s in one unit).  Below it (or with one
#: kernel) the entry points, whose compile with the prelude takes about 40 ms, are the other unit, which
#: still saves a few milliseconds on a one-kernel unit.
SPLIT_MIN_CHARS = 3000


def split_units(body: str) -> tuple[str, str] | None:
    """The body of a unit as two translation units, or None to compile it whole: the shared parts
    (constants) go to both, the entry points and module definition to the first; each kernel goes to the
    lighter one, or, for little kernel text, every kernel to the second."""
    if _cores() < 2:
        return None
    marks = (SHARED_MARK, KERNEL_MARK, ENTRY_MARK)
    pattern = "(" + "|".join(re.escape(m) for m in marks) + ")"
    pieces = re.split(pattern, body)
    lead, parts = pieces[0], list(zip(pieces[1::2], pieces[2::2]))
    kernels = [text for mark, text in parts if mark == KERNEL_MARK]
    rest = [m + t for m, t in parts if m == ENTRY_MARK]
    if not kernels or not rest:
        return None
    shared = "".join(m + t for m, t in parts if m == SHARED_MARK)
    units: list[list[str]] = [[], []]
    if len(kernels) < 2 or sum(map(len, kernels)) < SPLIT_MIN_CHARS:
        units[1] = [KERNEL_MARK + text for text in kernels]
    else:
        weight = [sum(map(len, rest)) // 4, 0]  # the entry points cost gcc far less per character than loops
        for text in sorted(kernels, key=len, reverse=True):
            i = weight.index(min(weight))
            units[i].append(KERNEL_MARK + text)
            weight[i] += len(text)
    return lead + shared + "".join(units[0]) + "".join(rest), lead + shared + "".join(units[1])


def _translate(texts: list[str], out: Path, tc: Toolchain) -> None:
    """Compile the translation units ``texts`` into the library ``out``, working in ``out``'s folder: one
    unit with the driver's link, or every unit at once (``-c``), then linked."""
    srcs = [out.with_suffix(f".{i}.c") for i in range(len(texts))]
    for src, text in zip(srcs, texts):
        src.write_text(text)
    if len(texts) == 1 and tc.link is None:
        _run([tc.cc, *tc.flags, str(srcs[0]), "-o", str(out), *tc.libs])
        return
    objs = [src.with_suffix(".o") for src in srcs]
    flags = [f for f in tc.flags if f != "-shared"]
    _run(*([tc.cc, *flags, "-c", str(src), "-o", str(obj)] for src, obj in zip(srcs, objs)))
    _run(_link_command(tc, objs, out))


def _link_command(tc: Toolchain, objs: list[Path], out: Path) -> list[str]:
    if tc.link is None:
        return [tc.cc, *tc.flags, *map(str, objs), "-o", str(out), *tc.libs]
    return _with_files(tc.link, objs, out)


def _with_files(link, objs: list[Path], out: Path) -> list[str]:
    """A direct link command with its ``OBJECTS`` and ``OUTPUT`` marks replaced by these files."""
    command = []
    for arg in link:
        command += map(str, objs) if arg == OBJECTS else [str(out)] if arg == OUTPUT else [arg]
    return command


def _cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _run(*cmds: list[str]) -> None:
    """Run the commands at once; CompileError for the first that fails.  Each has ended when this returns
    or raises (another failed, Ctrl-C): none goes on writing into a folder being removed."""
    procs: list[subprocess.Popen] = []
    try:
        for cmd in cmds:
            procs.append(_start(cmd))
        for cmd, proc in zip(cmds, procs):
            _, err = proc.communicate()
            if proc.returncode != 0:
                raise CompileError(f"command: {' '.join(cmd)}\n{err[-4000:]}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _start(cmd: list[str]) -> subprocess.Popen:
    try:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except OSError as e:
        raise CompilerNotFound(f"could not run the C compiler {cmd[0]!r}: {e}") from e


def _import(name: str, path: Path) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    sys.modules[name] = mod
    return mod
