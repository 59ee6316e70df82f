"""The kernel cache's folders and files: where it lives, which of them this process trusts, and how an
entry is written and checked.

A cached library is code that later processes run: whoever can write the cache can run code as its user.
So, as pip does with its cache, tailjit makes its folders mode 0700 and refuses a cache
folder or entry that another user owns or that group or others may write.  Then, and where the cache
cannot be written (a read-only folder), it warns once and builds into a private temporary folder for the
rest of the process: the program still runs, and never loads a file that someone else could have written.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import os
import shutil
import stat
import tempfile
import warnings
from pathlib import Path


class CacheRefused(RuntimeError):
    """A cache folder or entry that this process does not trust."""


class CacheWarning(UserWarning):
    """The kernel cache is not used (refused or not writable): this process builds into a private folder."""


#: ``TAILJIT_CACHE_DIR``'s value -> the folder used for it, resolved once: a relative value is taken from the
#: working folder when first read (gcc, given the files' paths, resolves them from the unit's own folder)
_roots: dict[str, Path] = {}
#: Folders this process created or checked (once each: the cache is hit on every build)
_folders: set[Path] = set()
#: This process's private folder, made on the first refusal
_private: list[Path] = []


def cache_dir() -> Path:
    """``TAILJIT_CACHE_DIR`` (made absolute) or ``~/.cache/tailjit``, created or checked once per
    process; the process's private folder where that is refused."""
    raw = os.environ.get("TAILJIT_CACHE_DIR") or ""
    root = _roots.get(raw)
    if root is None:
        path = Path(os.path.abspath(raw)) if raw else Path.home() / ".cache" / "tailjit"
        try:
            root = trusted_folder(path)
        except (OSError, CacheRefused) as e:
            root = _instead(path, e)
        _roots[raw] = root
    return root


def give_up(root: Path, why: Exception) -> bool:
    """Build into this process's private folder from now on instead of ``root``, which refused an entry
    or could not be written (``why``, warned once); False where ``root`` is that folder already."""
    if root in _private:
        return False
    private = _instead(root, why)
    for raw, folder in list(_roots.items()):
        if folder == root:
            _roots[raw] = private
    return True


def trusted_folder(path: Path) -> Path:
    """``path``, created (mode 0700) or checked by ``check_owner`` once per process."""
    if path not in _folders:
        make_folder(path)
        st = os.stat(path)
        if not stat.S_ISDIR(st.st_mode):
            raise CacheRefused(f"{path} is not a folder")
        check_owner(st, path)
        _folders.add(path)
    return path


def make_folder(path: Path) -> None:
    """Create ``path`` and its missing parents with mode 0700 (``os.makedirs`` gives the parents the
    umask's mode, which may let the group write them)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except FileNotFoundError:
        make_folder(path.parent)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass


def check_owner(st: os.stat_result, path: Path) -> None:
    """Raise CacheRefused where another user owns ``path`` (its ``st``) or group or others may write it."""
    if st.st_uid != os.geteuid():
        why = f"is owned by uid {st.st_uid}, not by this process's user (uid {os.geteuid()})"
    elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        why = f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    else:
        return
    raise CacheRefused(f"{path} {why}, so someone else could make this process run their code")


def _instead(path: Path, why: Exception) -> Path:
    if not _private:
        _private.append(Path(tempfile.mkdtemp(prefix="tailjit-cache-")))
        _folders.add(_private[0])
        atexit.register(shutil.rmtree, _private[0], ignore_errors=True)
    reason = why if isinstance(why, CacheRefused) else f"it cannot be written ({why})"
    warnings.warn(
        f"tailjit: not using the kernel cache {path}: {reason}. Building into {_private[0]} for this process "
        "instead (nothing is reused across processes); make the cache a folder of your own that only you can "
        "write (chmod -R go-w, chown) or point TAILJIT_CACHE_DIR at one.",
        CacheWarning,
        stacklevel=2,
    )
    return _private[0]


#: Files this process found valid, with the (size, mtime, inode) they had: the precompiled header is 14 MB,
#: and hashing it again for every compile cost about 0.01 s.
_checked: dict[Path, tuple[int, int, int]] = {}


def valid(path: Path) -> bool:
    """Whether ``path`` holds what its checksum sidecar says, the hash of its bytes and its name (an entry
    and sidecar copied from another key do not pass).  Both are read from the files opened, which
    ``check_owner`` passed first: CacheRefused where someone else could have written them."""
    try:
        with _opened(path.with_suffix(".sha256")) as (f, _):
            expected = f.read().decode(errors="replace")
        with _opened(path) as (f, st):
            seen = (st.st_size, st.st_mtime_ns, st.st_ino)
            if _checked.get(path) == seen:
                return True
            ok = _sidecar(f.read(), path) == expected
    except OSError:
        return False
    if ok:
        _checked[path] = seen
    return ok


def _sidecar(data: bytes, path: Path) -> str:
    """A checksum sidecar's text, as ``sha256sum`` writes it."""
    return f"{hashlib.sha256(data).hexdigest()}  {path.name}\n"


@contextlib.contextmanager
def _opened(path: Path):
    """``path`` opened for reading, with its status, once ``check_owner`` passed it."""
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        check_owner(st, path)
        yield f, st


def owned(path: Path) -> bool:
    """Whether ``path`` exists; CacheRefused where someone else could have written it."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    check_owner(st, path)
    return True


def forget(path: Path) -> None:
    """Make the entry ``path`` read as invalid, so that the next build makes it anew."""
    _checked.pop(path, None)
    path.with_suffix(".sha256").unlink(missing_ok=True)


def place(tmp: Path, final: Path) -> os.stat_result:
    """Rename ``tmp`` to ``final``, writable by its owner alone whatever the umask (``check_owner`` refuses
    an entry that group or others may write); ``tmp``'s status."""
    st = os.stat(tmp)
    os.chmod(tmp, stat.S_IMODE(st.st_mode) & 0o755)
    os.replace(tmp, final)
    return st


def publish(tmp: Path, final: Path) -> None:
    """Rename ``tmp`` (in a build's temporary folder) into place, then write its checksum sidecar (last, so
    that a crash in between leaves an entry that reads as invalid).  This process has just hashed it:
    ``valid`` need not read it again (a new precompiled prelude was hashed twice, 14 MB)."""
    text = _sidecar(tmp.read_bytes(), final)
    st = place(tmp, final)
    sidecar = tmp.with_name(tmp.name + ".sha256")
    sidecar.write_text(text)
    place(sidecar, final.with_suffix(".sha256"))
    _checked[final] = (st.st_size, st.st_mtime_ns, st.st_ino)


@contextlib.contextmanager
def locked(path: Path):
    """Hold the file lock ``path`` (made if missing, never through a link): concurrent processes build an
    entry once."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock
