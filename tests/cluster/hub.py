"""A stand-in for the Hugging Face Hub: the few endpoints ``huggingface_hub``'s
``HfApi.repo_info``, ``HfApi.list_repo_tree`` and ``snapshot_download`` use, over
repositories the tests generate. It is not the Hub: it serves what the client reads and
nothing more, so that hf:// inputs go through the real client without leaving the machine.

Served (``{kind}``: ``models`` or ``datasets``; the revision %-encoded as the client sends it):

- ``GET /api/{kind}/{repo}/revision/{revision}``: the repository's info at the revision
  (``sha``: the commit, ``siblings``); ``X-Error-Code: RepoNotFound`` or
  ``RevisionNotFound`` with a 404 as the Hub answers.
- ``GET /api/{kind}/{repo}/tree/{revision}?recursive=...``: the files of a commit (path,
  size, git blob id, and for files over ``LFS_FROM`` bytes the LFS sha256), one page.
- ``HEAD`` and ``GET /[datasets/]{repo}/resolve/{revision}/{path}``: a file, with
  ``X-Repo-Commit``, ``ETag`` (the blob id, or the LFS sha256) and Range requests.

A private repository answers 401 without its token, and every request with another
token gets 401 "Invalid credentials in Authorization header", as the Hub does. Bytes sent
are counted; ``cut_after`` closes a file body after that many bytes (a fetch killed half way).
"""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

LFS_FROM = 1024  # files this large are "LFS" files, with a sha256 in the tree


def blob_id(data: bytes) -> str:
    """The git blob id of ``data`` (what the Hub gives as ``oid``)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Repo:
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)  # branch or tag -> commit
    token: str = ""  # "": public

    def push(self, files: dict[str, bytes], ref: str = "main") -> str:
        """A commit of ``files`` that ``ref`` then names; its sha."""
        digest = hashlib.sha1(json.dumps(sorted(self.refs.items())).encode())
        for path in sorted(files):
            digest.update(path.encode() + b"\0" + blob_id(files[path]).encode())
        commit = digest.hexdigest()
        self.commits[commit] = dict(files)
        self.refs[ref] = commit
        return commit

    def resolve(self, revision: str) -> str | None:
        if revision in self.commits:
            return revision
        return self.refs.get(revision)


@dataclass
class Hub:
    repos: dict[tuple[str, str], Repo] = field(default_factory=dict)  # (kind, repo id)
    sent: int = 0
    cut_after: int | None = None
    requests: list[tuple[str, str]] = field(default_factory=list)  # (method, path)
    url: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def repo(self, repo_id: str, kind: str = "models", token: str = "") -> Repo:
        return self.repos.setdefault((kind, repo_id), Repo(token=token))


def _entry(path: str, data: bytes) -> dict[str, object]:
    entry: dict[str, object] = {"type": "file", "oid": blob_id(data), "size": len(data)}
    entry["path"] = path
    if len(data) >= LFS_FROM:
        sha = hashlib.sha256(data).hexdigest()
        entry["lfs"] = {"oid": sha, "size": len(data), "pointerSize": 134}
    return entry


def _etag(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest() if len(data) >= LFS_FROM else blob_id(data)


def _handler(hub: Hub) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _fail(self, status: int, code: str = "", message: str = "") -> None:
            headers = {"X-Error-Code": code, "X-Error-Message": message}
            self._json({"error": message or code}, status, {k: v for k, v in headers.items() if v})

        def _json(
            self, value: object, status: int = 200, headers: dict[str, str] | None = None
        ) -> None:
            body = json.dumps(value).encode()
            self.send_response(status)
            for name, text in {**(headers or {}), "Content-Type": "application/json"}.items():
                self.send_header(name, text)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _repo(self, kind: str, repo_id: str) -> Repo | None:
            repo = hub.repos.get((kind, repo_id))
            given = self.headers.get("Authorization", "").removeprefix("Bearer ").strip()
            if given and (repo is None or given != repo.token):
                self._fail(401, message="Invalid credentials in Authorization header")
                return None
            if repo is None or (repo.token and given != repo.token):
                self._fail(401 if repo else 404, "RepoNotFound", "Repository not found")
                return None
            return repo

        def _at(self, kind: str, repo_id: str, revision: str) -> tuple[str, dict[str, bytes]]:
            """The commit the revision names and its files (('', {}): answered with an error)."""
            repo = self._repo(kind, repo_id)
            commit = repo.resolve(urllib.parse.unquote(revision)) if repo else None
            if repo is not None and commit is None:
                self._fail(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return (commit, repo.commits[commit]) if repo and commit else ("", {})

        def do_GET(self) -> None:
            self._serve()

        def do_HEAD(self) -> None:
            self._serve()

        def _serve(self) -> None:
            path = self.path.split("?", 1)[0]
            with hub.lock:
                hub.requests.append((self.command, path))
            parts = path.lstrip("/").split("/")
            if parts[:1] == ["api"] and len(parts) >= 6 and parts[1] in ("models", "datasets"):
                self._api(parts[1], "/".join(parts[2:4]), parts[4], parts[5])
                return
            kind = "models"
            if parts[:1] == ["datasets"]:
                kind, parts = "datasets", parts[1:]
            if len(parts) >= 5 and parts[2] == "resolve":
                self._file(
                    kind, "/".join(parts[:2]), parts[3], urllib.parse.unquote("/".join(parts[4:]))
                )
                return
            self._fail(404, message=f"the stand-in hub does not serve {path}")

        def _api(self, kind: str, repo_id: str, what: str, revision: str) -> None:
            commit, files = self._at(kind, repo_id, revision)
            if not commit:
                return
            if what == "revision":
                siblings = [{"rfilename": p} for p in sorted(files)]
                self._json({"id": repo_id, "sha": commit, "siblings": siblings})
            elif what == "tree":
                self._json([_entry(p, files[p]) for p in sorted(files)])
            else:
                self._fail(404, message=f"the stand-in hub does not serve /api/.../{what}")

        def _file(self, kind: str, repo_id: str, revision: str, name: str) -> None:
            commit, files = self._at(kind, repo_id, revision)
            data = files.get(name)
            if not commit:
                return
            if data is None:
                self._fail(404, "EntryNotFound", f"{name} does not exist at {commit}")
                return
            start = 0
            wanted = self.headers.get("Range", "")
            if wanted.startswith("bytes=") and wanted[6:].split("-")[0].isdigit():
                start = min(int(wanted[6:].split("-")[0]), len(data))
            body = data[start:]
            self.send_response(206 if start else 200)
            self.send_header("X-Repo-Commit", commit)
            self.send_header("ETag", f'"{_etag(data)}"')
            self.send_header("Accept-Ranges", "bytes")
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command == "HEAD":
                return
            if hub.cut_after is not None:
                body = body[: hub.cut_after]
                self.close_connection = True
            self.wfile.write(body)
            with hub.lock:
                hub.sent += len(body)

    return Handler


@contextmanager
def serving(hub: Hub) -> Iterator[str]:
    """Serve ``hub`` on a free local port; its URL (for HF_ENDPOINT)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield hub.url
    finally:
        server.shutdown()
        server.server_close()
