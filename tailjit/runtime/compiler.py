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
* ``-fwrapv``: integer overflow wraps as in PyTorch instead of being undefined.

No ``-ffast-math``: NaN, inf and signed zeros keep IEEE semantics.

With gcc, a library is linked by ``ld`` itself, with gcc's own link command less what the process has
already and the C library's linker script (``_direct_link``).

Cache layout: ``<cache>/<key[:2]>/<key>.{c,so,sha256,lock}``.  The key hashes
the source, the full command, the compiler's version, the CPU, the Python ABI
and tailjit's version.  A build holds the key's file lock, writes to
temporary names and renames, so concurrent processes agree; the ``.sha256``
sidecar detects a truncated or corrupt library, which is then rebuilt.
"""

from __future__ import annotations

import ctypes.util
import fcntl
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


def cache_dir() -> Path:
    return Path(os.environ.get("TAILJIT_CACHE_DIR") or Path.home() / ".cache" / "tailjit")


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
        "-Wno-unused-variable", "-Wno-unused-function",
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
    if passed.exists():
        return True
    if not probe():
        return False
    try:
        passed.parent.mkdir(parents=True, exist_ok=True)
        passed.touch()
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
    from tailjit import __version__

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
    from tailjit.runtime.capi import api

    tc = toolchain()
    key = cache_key(source, tc)
    mod = _loaded.get(key)
    if mod is not None:
        return mod, BuildInfo(key, cache_dir() / key[:2] / f"{key}.so", 0.0, "memory")
    helpers = api()  # before the kernel's own compile: a first build of the runtime is not the kernel's time
    mod, info = _build(source, cache_dir() / key[:2], key, f"tj_{key[:24]}", tc)
    mod.init(helpers)
    _loaded[key] = mod
    return mod, info


def load_runtime(source: str) -> ModuleType:
    """The runtime module (``tailjit.runtime.capi``), built once per toolchain beside the prelude's
    precompiled header: like it, a cost of the toolchain, not of any kernel."""
    tc = toolchain()
    key = cache_key(source, tc)
    return _build(source, cache_dir() / "pch", key, f"tj_runtime_{key[:16]}", tc)[0]


def _build(source: str, folder: Path, key: str, name: str, tc: Toolchain) -> tuple[ModuleType, BuildInfo]:
    """Import ``<folder>/<key>.so`` as module ``name``, compiling ``source`` first unless a valid
    library is there (under the key's file lock, so concurrent processes compile once)."""
    so = folder / f"{key}.so"
    if _valid(so):
        try:
            return _import(name, so), BuildInfo(key, so, 0.0, "disk")
        except ImportError:
            pass  # unloadable despite its checksum: rebuild below
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{key}.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            seconds = 0.0
            if not _valid(so):
                seconds = _compile(source.replace(PLACEHOLDER, name), folder, key, tc)
            mod = _import(name, so)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return mod, BuildInfo(key, so, seconds, "compiled" if seconds else "disk")


#: Files this process found valid, with the (size, mtime) they had: the precompiled header is 14 MB,
#: and hashing it again for every compile cost about 0.01 s.
_checked: dict[Path, tuple[int, int]] = {}


def _valid(so: Path) -> bool:
    try:
        expected = so.with_suffix(".sha256").read_text().strip()
        st = so.stat()
        if _checked.get(so) == (st.st_size, st.st_mtime_ns):
            return True
        ok = hashlib.sha256(so.read_bytes()).hexdigest() == expected
    except OSError:
        return False
    if ok:
        _checked[so] = (st.st_size, st.st_mtime_ns)
    return ok


def _precompiled_prelude(prelude: str, tc: Toolchain) -> Path | None:
    """A header holding a prelude (the shared one, Python.h and the math helpers, or its part after
    Python's headers, for units of kernels alone), with its precompiled ``.gch`` beside it, built once
    per toolchain: parsing Python.h is most of a small kernel's compile time.  None when gcc cannot
    precompile."""
    digest = hashlib.sha256("\0".join([prelude, tc.cc, *tc.flags, tc.version, cpu_id()]).encode()).hexdigest()[:24]
    folder = cache_dir() / "pch"
    header = folder / f"prelude-{digest}.h"
    gch = folder / f"prelude-{digest}.h.gch"
    if _valid(gch):
        return header
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"prelude-{digest}.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if _valid(gch):
                return header
            tmp = f".tmp{os.getpid()}"
            tmp_h = folder / f"prelude-{digest}{tmp}.h"
            tmp_h.write_text(prelude)
            os.replace(tmp_h, header)
            tmp_gch = folder / f"prelude-{digest}{tmp}.gch"
            flags = [f for f in tc.flags if f != "-shared"]
            proc = subprocess.run(
                [tc.cc, *flags, "-x", "c-header", str(header), "-o", str(tmp_gch)], capture_output=True
            )
            if proc.returncode != 0:
                tmp_gch.unlink(missing_ok=True)
                return None
            _publish(tmp_gch, gch, tmp)
            return header
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _publish(tmp: Path, final: Path, suffix: str) -> None:
    """Rename ``tmp`` into place, then write its checksum sidecar (last, so that a
    crash in between leaves an entry that reads as invalid).  This process has just hashed it: ``_valid``
    need not read it again (a new precompiled prelude was hashed twice, 14 MB)."""
    digest = hashlib.sha256(tmp.read_bytes()).hexdigest()
    os.replace(tmp, final)
    sidecar = final.with_name(final.name + suffix + ".sha256")
    sidecar.write_text(digest)
    os.replace(sidecar, final.with_suffix(".sha256"))
    st = final.stat()
    _checked[final] = (st.st_size, st.st_mtime_ns)


def _compile(source: str, folder: Path, key: str, tc: Toolchain) -> float:
    from tailjit.codegen import PRELUDE_END, PYTHON_END

    tmp = f".tmp{os.getpid()}"
    c_path = folder / f"{key}.c"
    tmp_c, tmp_so = folder / f"{key}{tmp}.c", folder / f"{key}{tmp}.so"
    prelude, marker, body = source.partition(PRELUDE_END)
    header = _precompiled_prelude(prelude, tc) if marker else None
    head = f'#include "{header}"\n' if header else prelude + marker
    tmp_c.write_text(head + body)
    units = split_units(body) if marker else None
    heads = [head, head]
    if units is not None and header is not None and PYTHON_END in prelude:  # the second: kernels alone
        kernel_header = _precompiled_prelude(prelude.partition(PYTHON_END)[2], tc)
        heads[1] = f'#include "{kernel_header}"\n' if kernel_header else head
    start = time.perf_counter()
    try:
        if units is None and tc.link is None:
            _run([tc.cc, *tc.flags, str(tmp_c), "-o", str(tmp_so), *tc.libs], tmp_c, c_path, tmp_so)
        else:
            _compile_split([h + u for h, u in zip(heads, units or [body])], tmp_c, c_path, tmp_so, tc)
    except OSError as e:
        raise CompilerNotFound(f"could not run the C compiler {tc.cc!r}: {e}") from e
    seconds = time.perf_counter() - start
    os.replace(tmp_c, c_path)
    _publish(tmp_so, folder / f"{key}.so", tmp)
    return max(seconds, 1e-9)


#: A unit whose kernels hold at least this much C (two or more) is compiled as two translation units of
#: balanced kernel text at once, when the process may use two cores: gcc's time is in the kernels' loops
#: (the backward of pairwise IoU, 13 loop nests: 0.44 s in one unit).  Lowered from 12000: pairwise IoU's
#: forward (two kernels) then compiles in 0.08 s instead of 0.11, sequence_mask's training unit in 0.07 s
#: instead of 0.10.  Below it (or with one kernel) the entry points, whose compile with the prelude takes
#: about 40 ms (the prelude alone about 20; 57 before the runtime took over their work, ``capi.tj_run``),
#: are the other unit: a one-kernel unit compiled in 4-26 ms less (bbox2delta's forward 102 -> 76 ms, a
#: ``x * 2`` kernel 56 -> 52).
SPLIT_MIN_CHARS = 3000


def split_units(body: str) -> tuple[str, str] | None:
    """The body of a unit as two translation units, or None to compile it whole: the shared parts
    (constants) go to both, the entry points and module definition to the first; each kernel goes to the
    lighter one, or, for little kernel text, every kernel to the second."""
    from tailjit.codegen import ENTRY_MARK, KERNEL_MARK, SHARED_MARK

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


def _compile_split(units: list[str], tmp_c: Path, c_path: Path, tmp_so: Path, tc: Toolchain) -> None:
    """Compile the translation units at once (``-c``), then link them into ``tmp_so``."""
    srcs = [tmp_c.with_suffix(f".{i}.c") for i in range(len(units))]
    objs = [src.with_suffix(".o") for src in srcs]
    flags = [f for f in tc.flags if f != "-shared"]
    procs: list[tuple[list[str], subprocess.Popen]] = []
    try:
        for src, obj, text in zip(srcs, objs, units):
            src.write_text(text)
            procs.append(_start([tc.cc, *flags, "-c", str(src), "-o", str(obj)]))
        for cmd, proc in procs:
            _finish(cmd, proc, tmp_c, c_path, tmp_so)
        _run(_link_command(tc, objs, tmp_so), tmp_c, c_path, tmp_so)
    finally:
        for _, proc in procs:
            if proc.poll() is None:  # the other unit failed: stop this one
                proc.kill()
                proc.wait()
        for f in (*srcs, *objs):
            f.unlink(missing_ok=True)


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


def _start(cmd: list[str]) -> tuple[list[str], subprocess.Popen]:
    return cmd, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(cmd: list[str], proc: subprocess.Popen, tmp_c: Path, c_path: Path, tmp_so: Path) -> None:
    _, err = proc.communicate()
    if proc.returncode != 0:
        os.replace(tmp_c, c_path)
        tmp_so.unlink(missing_ok=True)
        raise CompileError(
            f"the C compiler failed on generated code ({c_path}); this is a tailjit bug, please report it.\n"
            f"command: {' '.join(cmd)}\n{err[-4000:]}"
        )


def _run(cmd: list[str], tmp_c: Path, c_path: Path, tmp_so: Path) -> None:
    _finish(*_start(cmd), tmp_c, c_path, tmp_so)


def _import(name: str, path: Path) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    sys.modules[name] = mod
    return mod
