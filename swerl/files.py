"""Files written all or nothing: a reader, or a run resumed after a crash, finds the old content or the new,
never a torn file.

The content goes to a temporary file beside the target (same directory, so the same filesystem), is flushed
to disk, then `os.replace`d over the target, which POSIX makes atomic. The temporary name is unique per
call (`mkstemp`), so two writers of one path never share a half-written file; a writer that fails removes
its temporary file. The file gets the mode a plain write would give it (the target's, or per the umask).
Standard library only, so every room may use it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


def _read_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# read once, at import (os.umask can only be read by setting it, which is not thread-safe later)
_NEW_FILE_MODE = 0o666 & ~_read_umask()


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A fresh temporary path beside `path` for a writer that wants a file name (`savefig`, a download);
    on a clean exit what was written there replaces `path`, on an exception it is removed and `path` is
    left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # the target's suffix last: writers such as savefig pick the format from it
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.tmp-", suffix=path.suffix)
    os.close(fd)
    tmp = Path(name)
    try:
        # mkstemp makes the file 0600; the result keeps the target's mode, or a new file's (umask applied)
        os.chmod(tmp, path.stat().st_mode & 0o7777 if path.exists() else _NEW_FILE_MODE)
        yield tmp
        with tmp.open("rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write(path: str | os.PathLike[str], data: str | bytes) -> None:
    """`data` (text as UTF-8, or bytes) at `path`, all or nothing; parent directories are made."""
    with atomic_path(path) as tmp:
        if isinstance(data, str):
            tmp.write_text(data, encoding="utf-8")
        else:
            tmp.write_bytes(data)


def sha256_file(path: str | os.PathLike[str]) -> str:
    """The file's sha256, hex."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
