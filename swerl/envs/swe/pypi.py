"""The package index as it stood at one moment: what makes a built environment a function of its row.

SWE-bench's environment script installs unpinned requirements (`conda create ... pytest`, `pip install -r
requirements.txt`), so what an image holds depends on the day it was built. swerl resolves every
package of a build against `AsOfIndex`: a local PEP 503 index, served to pip on 127.0.0.1, that lists of
each project only the files the upstream index (PyPI) had received before `RESOLVED_AS_OF`. Any pip,
the host's or the 20.3 a Python 3.5 image runs, then picks the same versions on any machine, any day:

- **Pages** come from PyPI's JSON simple API (PEP 691), whose upload times (PEP 700) do the filtering;
  the filtered page is kept under `pages/<as-of>/` and served from there afterwards (`refresh` asks
  upstream again, as `build-images --check` does), so an offline build resolves as an online one.
- **Files** are served from the wheels folder, a cache named by content: a file is used only when its
  sha256 is the one the page gives, else it is downloaded again. What else the folder holds is never
  offered to pip — the folder is not a source of versions.
- Yanks are PyPI's as of the page's fetch (pip skips a yanked file unless pinned exactly).
"""

from __future__ import annotations

import hashlib
import html
import json
import re
import shutil
import ssl
import threading
from collections.abc import Callable
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

from swerl.files import atomic_path, atomic_write, sha256_file

RESOLVED_AS_OF = "2025-09-11T02:57:58Z"
"""The moment every build resolves at: the upload of swebench 4.1.0 (its wheel on PyPI), the release
whose spec tables and environment recipe swerl builds from (`swerl.envs.swe.specs.SPEC_RELEASE`) — an
environment as that release built it that day."""
UPSTREAM = "https://pypi.org/simple"
"""The index the pages come from: it must serve PEP 691 JSON with PEP 700 upload times."""
_JSON = "application/vnd.pypi.simple.v1+json"


class IndexUnavailable(OSError):
    """The upstream index could not give a page or a file (unreachable, no upload times, bad hash)."""


def canonical(name: str) -> str:
    """PEP 503's normalized project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))



class AsOfIndex:
    """`with AsOfIndex(files, pages) as index:` serves `index.url` to pip until the block ends (see the
    module docstring). `offline`: nothing is asked upstream (a page or file not cached is a 404, and
    `misses` names it)."""

    def __init__(self, files: Path, pages: Path, *, as_of: str = RESOLVED_AS_OF, offline: bool = False,
                 refresh: bool = False, upstream: str = UPSTREAM, verify: ssl.SSLContext | bool = True,
                 log: Callable[[str], None] | None = None) -> None:
        self.files, self.as_of, self.offline, self.refresh = Path(files), as_of, offline, refresh
        self.pages = Path(pages) / as_of.replace(":", "")
        self.upstream, self.verify, self.log = upstream.rstrip("/"), verify, log
        self.cutoff = _parse_time(as_of)
        self.misses: list[str] = []
        """What was asked and not had: `page NAME (offline)`, `file F: why`."""
        self.errors: list[str] = []
        self._urls: dict[str, str] = {}  # sha256 → upstream URL, from the pages served
        self._verified: dict[str, tuple[int, int]] = {}  # file name → (size, mtime) once its hash matched
        self._refreshed: set[str] = set()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._client: httpx.Client | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "AsOfIndex is used outside its `with` block"
        return f"http://127.0.0.1:{self._server.server_address[1]}/simple/"

    def __enter__(self) -> AsOfIndex:
        self.files.mkdir(parents=True, exist_ok=True)
        self._client = httpx.Client(timeout=180, verify=self.verify, follow_redirects=True)
        index = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                index._serve(self)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="swerl-as-of-index", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._client is not None:
            self._client.close()

    # ---- pages ----

    def page(self, project: str) -> list[dict]:
        """The files of `project` uploaded before the cutoff: {filename, url, sha256, requires_python,
        yanked}. Raises IndexUnavailable / FileNotFoundError (offline, not cached)."""
        name = canonical(project)
        path = self.pages / f"{name}.json"
        with self._lock:
            fresh = self.refresh and name not in self._refreshed
        if path.is_file() and not fresh:
            files = json.loads(path.read_text())["files"]
        elif self.offline:
            raise FileNotFoundError(f"page {name} (offline, not in {self.pages})")
        else:
            assert self._client is not None
            try:
                got = self._client.get(f"{self.upstream}/{name}/", headers={"Accept": _JSON})
            except httpx.HTTPError as e:
                raise IndexUnavailable(f"{self.upstream}/{name}/: {e}") from e
            if got.status_code == 404:
                files = []
            elif got.status_code != 200 or not got.headers.get("content-type", "").startswith(_JSON):
                raise IndexUnavailable(f"{self.upstream}/{name}/ answered {got.status_code} "
                                  f"{got.headers.get('content-type', '')} (PEP 691 JSON needed)")
            else:
                files = self._filter(name, got.json()["files"])
            atomic_write(path, json.dumps({"name": name, "as_of": self.as_of, "files": files}, indent=0))
            with self._lock:
                self._refreshed.add(name)
        with self._lock:
            self._urls.update((f["sha256"], f["url"]) for f in files)
        return files

    def _filter(self, name: str, files: list[dict]) -> list[dict]:
        kept = []
        for f in files:
            if "upload-time" not in f:
                raise IndexUnavailable(f"{self.upstream}/{name}/ gives no upload times (PEP 700): "
                                       "files cannot be told apart by date")
            sha = (f.get("hashes") or {}).get("sha256")
            if not sha or _parse_time(f["upload-time"]) >= self.cutoff:
                continue
            kept.append({"filename": f["filename"], "url": f["url"], "sha256": sha,
                         "requires_python": f.get("requires-python"), "yanked": f.get("yanked", False)})
        return kept

    # ---- files ----

    def file(self, sha: str, filename: str) -> Path:
        """The cached file of that name whose sha256 is `sha`, downloaded when missing or different."""
        if "/" in filename or filename.startswith("."):
            raise FileNotFoundError(filename)
        path = self.files / filename
        if path.is_file():
            st = path.stat()
            with self._lock:
                known = self._verified.get(filename) == (st.st_size, int(st.st_mtime_ns))
            if known or sha256_file(path) == sha:
                with self._lock:
                    self._verified[filename] = (st.st_size, int(st.st_mtime_ns))
                return path
        if self.offline:
            raise FileNotFoundError(f"file {filename} (offline, not in {self.files})")
        with self._lock:
            url = self._urls.get(sha)
        if url is None:
            raise FileNotFoundError(f"file {filename}: on no page served")
        if self.log:
            self.log(f"downloading {filename}")
        assert self._client is not None
        try:
            with atomic_path(path) as tmp:  # a download cut short or not matching its sha256 is not kept
                h = hashlib.sha256()
                with tmp.open("wb") as out, self._client.stream("GET", url) as got:
                    if got.status_code != 200:
                        raise IndexUnavailable(f"{url} answered {got.status_code}")
                    for chunk in got.iter_bytes(1 << 20):
                        h.update(chunk)
                        out.write(chunk)
                if h.hexdigest() != sha:
                    raise IndexUnavailable(f"{url}: sha256 {h.hexdigest()} is not the page's {sha}")
        except (httpx.HTTPError, OSError) as e:
            raise e if isinstance(e, IndexUnavailable) else IndexUnavailable(f"{url}: {e}") from e
        st = path.stat()
        with self._lock:
            self._verified[filename] = (st.st_size, int(st.st_mtime_ns))
        return path

    # ---- the server ----

    def _serve(self, req: BaseHTTPRequestHandler) -> None:
        parts = [p for p in req.path.split("?")[0].split("/") if p]
        try:
            if len(parts) == 2 and parts[0] == "simple":
                body = self._html(parts[1]).encode()
                req.send_response(200)
                req.send_header("Content-Type", "text/html; charset=utf-8")
                req.send_header("Content-Length", str(len(body)))
                req.end_headers()
                req.wfile.write(body)
                return
            if len(parts) == 3 and parts[0] == "files":
                path = self.file(parts[1], parts[2])
                req.send_response(200)
                req.send_header("Content-Type", "application/octet-stream")
                req.send_header("Content-Length", str(path.stat().st_size))
                req.end_headers()
                with open(path, "rb") as f:
                    shutil.copyfileobj(f, req.wfile, 1 << 20)
                return
            req.send_error(404)
        except FileNotFoundError as e:
            with self._lock:
                self.misses.append(str(e))
            req.send_error(404)
        except IndexUnavailable as e:
            with self._lock:
                self.errors.append(str(e))
            req.send_error(502)

    def _html(self, project: str) -> str:
        links = []
        for f in self.page(project):
            attrs = ""
            if f["requires_python"]:
                attrs += f' data-requires-python="{html.escape(f["requires_python"])}"'
            if f["yanked"]:
                reason = f["yanked"] if isinstance(f["yanked"], str) else ""
                attrs += f' data-yanked="{html.escape(reason)}"'
            href = f"/files/{f['sha256']}/{f['filename']}#sha256={f['sha256']}"
            links.append(f'<a href="{html.escape(href)}"{attrs}>{html.escape(f["filename"])}</a><br/>')
        return "<!DOCTYPE html><html><body>\n" + "\n".join(links) + "\n</body></html>\n"


__all__ = ["RESOLVED_AS_OF", "UPSTREAM", "AsOfIndex", "IndexUnavailable", "canonical"]
