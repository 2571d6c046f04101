"""Remote I/O for every step: local paths, `file://`, and any fsspec URI (gs:// above all).

The one place that knows whether a path is remote, how to read, list and write it, how to bring a
remote directory to local disk and how to publish a local directory. The trainer, the evaluator,
the components and Beam workers all use it, so a URI means the same thing everywhere:

    is_remote(uri)            gs://b/x -> True; /x, x, file:///x -> False
    local_path(uri)           file:///x -> /x (a remote URI raises)
    normalize(uri)            file:///x -> /x; gs://b/x and /x unchanged
    exists / open / listdir / glob / remove / file_sizes / file_versions
    cached_copy(uri)          a node-local copy, downloaded once per node (a file lock makes N
                              ranks on a node wait for one download); re-used by later runs
    copy_to_local(uri, dest)  a one-off copy (the caller owns dest)
    upload_dir(local, uri)    replace `uri` with the files of a local directory (local: all or
                              nothing, through a hidden sibling that is removed on failure)
    not_writable(path)        why a local output directory cannot be created or written, or None
    disk_error(exc, path)     a DiskFullError naming the disk of `path` when `exc` is a full
                              disk (ENOSPC, EDQUOT), else None
    disk_errors_named(path)   a block in which a full disk is re-raised as that DiskFullError

Everything streams through fsspec (a multi-GB model never sits in memory). Failures name the URI
and what to change (a missing object or bucket, no permission), raised as FileNotFoundError /
PermissionError subclasses. Which server a gs:// URI reaches is the clients' business (gcsfs and
google-cloud-storage honour `STORAGE_EMULATOR_HOST`, the tests' GCS emulator, and Application
Default Credentials). Every package imports it (Beam workers too), so it imports nothing of this
project, nor Beam or torch (pyproject.toml's import contracts); it sits under trainer/ only
because the top level is fixed.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

log = logging.getLogger(__name__)

CACHE_ENV = "LLMFT_CACHE_DIR"
"""Where `cached_copy` keeps node-local copies (default: <tmp>/llmft-cache)."""
COMPLETE = ".complete"
"""Written into a cached copy after the last file arrived: only such copies are used."""


class StorageNotFound(FileNotFoundError):
    """A path, object or bucket that does not exist (the message says which, and what to do)."""


class StoragePermissionDenied(PermissionError):
    """The credentials in use may not read or write the path (the message says which role)."""


class DiskFullError(OSError):
    """A write failed because the disk (or the quota) is full; the message names the disk, its
    free space and what to do. Raised instead of the writer's own error, which often hides it."""


def is_remote(uri: str) -> bool:
    """True for `scheme://...` other than file://: gs://, s3://, memory://, hf://, ..."""
    scheme, sep, _ = uri.partition("://")
    return bool(sep) and scheme not in ("", "file", "local") and "/" not in scheme


def local_path(uri: str) -> str:
    """The filesystem path of a local path or file:// URI."""
    if is_remote(uri):
        raise ValueError(f"{uri!r} is not a local path")
    return uri.removeprefix("file://")


def normalize(uri: str) -> str:
    """A file:// URI as the plain path it names; remote URIs and plain paths unchanged."""
    return uri if is_remote(uri) else local_path(uri)


def same_location(a: str, b: str) -> bool:
    """Whether `a` and `b` name the same place (local paths resolved: relative, symlinks)."""
    return _canonical(a) == _canonical(b)


def holds(outer: str, inner: str) -> bool:
    """Whether `inner` is `outer` or lies inside it (local paths resolved, as `same_location`)."""
    outer_c, inner_c = _canonical(outer), _canonical(inner)
    return inner_c == outer_c or inner_c.startswith(outer_c.rstrip("/") + "/")


def _canonical(uri: str) -> str:
    if is_remote(uri):
        return uri.rstrip("/")
    return os.path.realpath(os.path.expanduser(local_path(uri)))


def join(root: str, *parts: str) -> str:
    """`root/part/...` with exactly one slash between parts (URIs and paths alike)."""
    out = root.rstrip("/")
    for part in parts:
        out += "/" + part.strip("/")
    return out


def _fs(uri: str) -> tuple[Any, str]:
    import fsspec

    fs, path = fsspec.core.url_to_fs(uri)
    # Other processes (ranks, steps) change what is stored: never answer from a stale listing.
    fs.invalidate_cache()
    return fs, path


def _bucket_missing(uri: str) -> str | None:
    """The bucket of a gs:// URI when the bucket itself does not exist."""
    scheme, _, rest = uri.partition("://")
    bucket = rest.split("/", 1)[0]
    if scheme not in ("gs", "gcs") or not bucket:
        return None
    try:
        fs, _ = _fs(uri)
        return None if fs.exists(bucket) else bucket
    except Exception:  # only sharpening a message: the original error is raised either way
        return None


def explain(uri: str, exc: BaseException, action: str = "read") -> Exception | None:
    """The error to raise instead of `exc` (raised while doing `action` on `uri`): one that names
    the URI and the fix, or None when `exc` is not about a missing path or a permission."""
    if isinstance(exc, StorageNotFound | StoragePermissionDenied):
        return None
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    code = getattr(exc, "code", None)
    if isinstance(exc, PermissionError) or code in (401, 403) or text.startswith("Forbidden"):
        role = "roles/storage.objectViewer" if action == "read" else "roles/storage.objectAdmin"
        return StoragePermissionDenied(
            f"no permission to {action} {uri}: grant the account these credentials belong to "
            f"{role} on the bucket, or run with credentials that have it ({text})"
        )
    if isinstance(exc, FileNotFoundError) or code == 404:
        bucket = _bucket_missing(uri) if is_remote(uri) else None
        if bucket:
            return StorageNotFound(
                f"bucket {bucket!r} of {uri} does not exist: create it "
                f"(gcloud storage buckets create gs://{bucket}) or fix the URI"
            )
        return StorageNotFound(f"{uri} does not exist: check the path (or write it first)")
    return None


@contextlib.contextmanager
def _explained(uri: str, action: str = "read") -> Iterator[None]:
    """Re-raise storage failures inside the block as `explain` says."""
    try:
        yield
    except Exception as exc:
        better = explain(uri, exc, action)
        if better is None:
            raise
        raise better from exc


def exists(uri: str) -> bool:
    """Whether a file or directory exists at `uri` (False also for a missing bucket)."""
    if not is_remote(uri):
        return os.path.exists(local_path(uri))
    fs, path = _fs(uri)
    with _explained(uri):
        return bool(fs.exists(path))


def isdir(uri: str) -> bool:
    if not is_remote(uri):
        return os.path.isdir(local_path(uri))
    fs, path = _fs(uri)
    with _explained(uri):
        return bool(fs.isdir(path))


@contextlib.contextmanager
def open(uri: str, mode: str = "rb", **kwargs: Any) -> Iterator[IO[Any]]:
    """A file object for `uri` (streams; nothing is read ahead into memory). Writes create the
    parent directories of local paths."""
    import fsspec

    action = "read" if "r" in mode else "write"
    if not is_remote(uri) and action == "write":
        os.makedirs(os.path.dirname(local_path(uri)) or ".", exist_ok=True)
    # Only opening and closing are translated: errors of the caller's own code pass unchanged.
    with _explained(uri, action):
        handle = fsspec.open(uri, mode, **kwargs).open()
    try:
        yield handle
    finally:
        with _explained(uri, action):
            handle.close()


def read_text(uri: str) -> str:
    with open(uri, "r", encoding="utf-8") as f:
        return str(f.read())


def write_text(uri: str, text: str) -> None:
    with open(uri, "w", encoding="utf-8") as f:
        f.write(text)


def _as_uri(fs: Any, path: str, like: str) -> str:
    """fsspec returns paths without the scheme; give them back in the caller's form."""
    if not is_remote(like):
        return path
    return fs.unstrip_protocol(path)


def listdir(uri: str) -> list[str]:
    """Full paths (in `uri`'s form) of the entries directly under `uri`, sorted; [] if missing."""
    fs, path = _fs(uri)
    with _explained(uri):
        if not fs.exists(path):
            return []
        return sorted(_as_uri(fs, p.rstrip("/"), uri) for p in fs.ls(path, detail=False))


def glob(pattern: str) -> list[str]:
    """Paths (in `pattern`'s form) that match `pattern`, sorted."""
    fs, path = _fs(pattern)
    with _explained(pattern):
        return sorted(_as_uri(fs, p, pattern) for p in fs.glob(path))


def file_versions(pattern: str) -> dict[str, dict[str, Any]]:
    """The files `pattern` matches (in its form), each with its size and version: the object
    generation on gs://, the modification time (ns) of a local file; a schedule's window
    (components/schedules/window.py) compares them run to run."""
    fs, path = _fs(pattern)
    with _explained(pattern):
        found = fs.glob(path, detail=True)

    out = {}
    for name, info in sorted(found.items()):
        if info.get("type", "file") == "file":
            version = info.get("generation") or info.get("mtime") or info.get("etag") or ""
            if not is_remote(pattern):
                version = os.stat(name).st_mtime_ns
            out[_as_uri(fs, name, pattern)] = {"size": int(info["size"]), "version": str(version)}
    return out


def file_sizes(uri: str) -> dict[str, int]:
    """Every file under the directory `uri`, by its path relative to `uri`, with its size in
    bytes ({} when `uri` does not exist)."""
    fs, path = _fs(uri)
    root = path.rstrip("/") + "/"
    with _explained(uri):
        if not fs.exists(path):
            return {}
        found = fs.find(path, detail=True)
    return {name[len(root) :]: int(info["size"]) for name, info in found.items()}


def remove(uri: str) -> None:
    """Delete a file or a directory tree; nothing happens when it does not exist."""
    fs, path = _fs(uri)
    with _explained(uri, "delete"):
        if fs.exists(path):
            fs.rm(path, recursive=True)


def copy_to_local(uri: str, dest: str | Path, *, skip_suffixes: tuple[str, ...] = ()) -> Path:
    """Copy the directory (or file) at `uri` into `dest`, streaming. Files whose names end with
    one of `skip_suffixes` are left out (e.g. weights, when only a tokenizer is needed)."""
    dest = Path(dest)
    fs, root = _fs(uri)
    with _explained(uri):
        if not fs.exists(root):
            raise FileNotFoundError(uri)
        if not fs.isdir(root):
            dest.parent.mkdir(parents=True, exist_ok=True)
            fs.get(root, str(dest))
            return dest
        dest.mkdir(parents=True, exist_ok=True)
        base = root.rstrip("/") + "/"
        for path in fs.find(root):
            rel = path[len(base) :] if path.startswith(base) else path.rsplit("/", 1)[-1]
            if not rel or rel.endswith(skip_suffixes):
                continue
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            fs.get(path, str(target))
    return dest


def cache_dir() -> Path:
    """The node-local cache root ($LLMFT_CACHE_DIR, default <tmp>/llmft-cache)."""
    return Path(os.environ.get(CACHE_ENV) or Path(tempfile.gettempdir()) / "llmft-cache")


def cached_copy(uri: str) -> str:
    """A local directory holding `uri`: the path itself when local, else a node-local copy,
    downloaded by the first caller under a file lock (other ranks and later runs wait, then find
    it COMPLETE; a half download is redone). Keyed by URI: publish new models under new URIs."""
    if not is_remote(uri):
        return local_path(uri)
    from filelock import FileLock

    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(uri.rstrip("/").encode()).hexdigest()[:16]
    target = root / key
    with FileLock(str(root / f"{key}.lock")):
        if not (target / COMPLETE).exists():
            partial = root / f"{key}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            shutil.rmtree(target, ignore_errors=True)
            log.info("downloading %s to %s", uri, target)
            copy_to_local(uri, partial)
            partial.rename(target)
            (target / COMPLETE).write_text(uri + "\n")
    return str(target)


def upload_dir(local: str | Path, uri: str) -> None:
    """Make `uri` hold exactly the files of the local directory `local` (streamed).

    Locally it is all or nothing: the copy goes to a hidden sibling first, which replaces `uri`
    only once complete, so a failed copy (a full disk) leaves the previous `uri` as it was and no
    half-written directory that looks complete (and no hidden sibling either)."""
    local = Path(local)
    if not is_remote(uri):
        dest = Path(local_path(uri))
        partial = dest.with_name(f".{dest.name}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        try:
            with disk_errors_named(str(dest)):
                shutil.copytree(local, partial)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        if dest.exists():
            shutil.rmtree(dest)
        partial.rename(dest)
        return
    fs, root = _fs(uri)
    with _explained(uri, "write"):
        if fs.exists(root):
            fs.rm(root, recursive=True)
        for path in sorted(p for p in local.rglob("*") if p.is_file()):
            fs.put_file(str(path), f"{root.rstrip('/')}/{path.relative_to(local).as_posix()}")


def upload_file(local: str | Path, uri: str) -> None:
    """Copy one local file to `uri` (streamed)."""
    if not is_remote(uri):
        dest = local_path(uri)
        os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
        shutil.copyfile(local, dest)
        return
    fs, path = _fs(uri)
    with _explained(uri, "write"):
        fs.put_file(str(local), path)


_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_ERRNO_IN_TEXT = re.compile(r"\[Errno (\d+)\]|\(os error (\d+)\)")
"""How a wrapped OSError shows in another error's text: Python's `[Errno 28]` (Beam re-raises a
worker's error as a RuntimeError with that text) and Rust's `(os error 28)` (safetensors)."""


def _errnos(exc: BaseException) -> Iterator[int]:
    """The errno of every OSError in `exc`'s chain, and those written in the chain's messages."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno is not None:
            yield current.errno
        for args in getattr(current, "args", ()), [str(current)]:
            for text in map(str, args):
                for match in _ERRNO_IN_TEXT.finditer(text):
                    yield int(match.group(1) or match.group(2))
        current = current.__cause__ or current.__context__


def _existing_ancestor(path: str) -> str:
    current = os.path.abspath(os.path.expanduser(path))
    while not os.path.exists(current) and current != os.path.dirname(current):
        current = os.path.dirname(current)
    return current


def mount_point(path: str) -> str:
    """The mount point of the file system that holds (or would hold) the local `path`."""
    current = os.path.realpath(_existing_ancestor(path))
    while not os.path.ismount(current):
        current = os.path.dirname(current)
    return current


def describe_disk(path: str) -> str:
    """`the disk mounted at /x (N MB free of M MB)` for the local `path`; remote: the URI."""
    if is_remote(path):
        return f"the storage of {path}"
    where = mount_point(local_path(path))
    try:
        usage = shutil.disk_usage(where)
    except OSError:
        return f"the disk mounted at {where}"
    return (
        f"the disk mounted at {where} ({usage.free / 1e6:.1f} MB free of "
        f"{usage.total / 1e6:.1f} MB)"
    )


def disk_error(exc: BaseException, path: str) -> DiskFullError | None:
    """A DiskFullError to raise instead of `exc` when `exc` (or anything in its chain, or its
    text) is a full disk or quota while writing `path`; None for any other error."""
    if isinstance(exc, DiskFullError):
        return exc
    if not any(code in _FULL_ERRNOS for code in _errnos(exc)):
        return None
    path = _failed_file(exc) or path  # the disk that is full, when the error names its file
    return DiskFullError(
        f"no space left on {describe_disk(path)} while writing {path}: free space there or "
        "write the output to another disk",
    )


def _failed_file(exc: BaseException) -> str | None:
    """The local file an OSError in `exc`'s chain names (a log or temporary file may be on
    another disk than the output), or None."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        name = getattr(current, "filename", None)
        if isinstance(current, OSError) and isinstance(name, str) and not is_remote(name):
            return name
        current = current.__cause__ or current.__context__
    return None


@contextlib.contextmanager
def disk_errors_named(path: str) -> Iterator[None]:
    """Re-raise a full disk inside the block as the DiskFullError that names the disk of `path`
    (writers hide it: Beam re-raises a worker's ENOSPC as a RuntimeError with its text,
    safetensors as "os error 28", DCP as a CheckpointException, a BaseException); any other
    error passes unchanged."""
    try:
        yield
    except BaseException as exc:
        full = disk_error(exc, path)
        if full is None:
            raise
        raise full from None


def not_writable(path: str) -> str | None:
    """Why the local directory `path` cannot be created or written (None: it can, or it is
    remote). Checked before a step starts, so the answer is an error message, not a traceback
    after the work. `access` answers for root too on a read-only file system."""
    if is_remote(path):
        return None
    target = os.path.abspath(os.path.expanduser(local_path(path)))
    existing = _existing_ancestor(target)
    if not os.path.isdir(existing):
        return f"{existing} is a file, so {target} cannot be a directory: give another path"
    if not os.access(existing, os.W_OK | os.X_OK):
        reason = "a read-only file system" if _read_only(existing) else "no write permission"
        return f"{existing} is not writable ({reason}): give a directory you can write"
    return None


def _read_only(path: str) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def check_tmpdir() -> None:
    """Refuse a TMPDIR that is not a writable directory (Python falls back to /tmp silently,
    etcd and compilers fail on it, the local run state lives under it)."""
    value = os.environ.get("TMPDIR")
    if not value:
        return
    if not os.path.isdir(value):
        problem = "is a file" if os.path.exists(value) else "does not exist"
    elif not os.access(value, os.W_OK | os.X_OK):
        problem = "is not writable"
    else:
        return
    raise ValueError(
        f"TMPDIR={value!r} {problem}: create it (mkdir -p {value}), point TMPDIR at a writable "
        "directory, or unset it"
    )
