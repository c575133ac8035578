"""Reading unified diffs (a patch as SWE-bench rows and agents give it): which files it touches, creates,
and each file's part. Below grading, scrub and the audit, which all ask these questions of a patch."""

from __future__ import annotations

import re

_DIFF_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)", re.M)


def patch_files(patch: str) -> list[str]:
    """Paths a unified diff touches (both sides of renames)."""
    files: list[str] = []
    for a, b in _DIFF_HEADER.findall(patch):
        for f in (a, b):
            if f not in files:
                files.append(f)
    return files


def added_files(patch: str) -> list[str]:
    """Paths a unified diff creates (`new file mode` or `--- /dev/null`)."""
    out = []
    for chunk in re.split(r"^(?=diff --git )", patch, flags=re.M):
        m = _DIFF_HEADER.match(chunk)
        if m and (re.search(r"^new file mode ", chunk, re.M) or re.search(r"^--- /dev/null$", chunk, re.M)):
            out.append(m.group(2))
    return out


def file_chunks(patch: str) -> dict[str, str]:
    """Each file's part of a unified diff, by its new path."""
    out = {}
    for chunk in re.split(r"^(?=diff --git )", patch, flags=re.M):
        m = _DIFF_HEADER.match(chunk)
        if m:
            out[m.group(2)] = chunk
    return out
