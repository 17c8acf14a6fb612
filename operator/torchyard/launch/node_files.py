"""What the launcher moves in and out of a node: the source before the ranks start
(:func:`prepare`: ``--copy`` a ConfigMap's code or snapshot, ``--fetch`` a registry
snapshot; :func:`extract_snapshot` unpacks one safely) and the logs and outputs after
(:func:`archive`: uploaded to the registry service, :func:`upload_file`).

Standard library only, Python >= 3.8; shipped with the launcher. Tested in
tests/unit/launcher/test_snapshot_extraction.py, tests/unit/launcher/test_archive_retries.py
and, against a real registry service, tests/integration/test_archiving.py.
"""

from __future__ import annotations

import contextlib
import os
import ssl
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torchyard.launch.contract import (
    SNAPSHOT,
    TERMINATION_LOG,
    TORCHYARD_ARCHIVE_ATTEMPTS,
    TORCHYARD_INPUTS_COPIES,
    TORCHYARD_NAMESPACE,
    TORCHYARD_OUTPUTS,
    TORCHYARD_OUTPUTS_OPTIONAL,
    TORCHYARD_REGISTRY_CA,
    TORCHYARD_REGISTRY_TOKEN_FILE,
    TORCHYARD_REGISTRY_URL,
    TORCHYARD_RUN,
    TORCHYARD_SNAPSHOT_MAX_FILES,
    TORCHYARD_TERMINATION_LOG,
    LaunchError,
    int_env,
    snapshot_limits,
    termination_message,
    write_termination,
)


def registry_context(env: Mapping[str, str]) -> ssl.SSLContext | None:
    """What verifies the registry service's certificate: the CA in TORCHYARD_REGISTRY_CA
    (PEM, which the operator passes to node Pods), else None (the system's CAs)."""
    pem = env.get(TORCHYARD_REGISTRY_CA, "")
    return ssl.create_default_context(cadata=pem) if pem.strip() else None


# The exit code of a node whose ranks succeeded but whose archive upload failed.
ARCHIVE_FAILED_EXIT = 3
# A registry that is still starting (a run submitted right after `helm install`) or
# restarting answers with a refused connection or a 5xx: retry for about a minute
# (0.5, 1, 2, 4, 8, 8, 8, 8, 8, 8 s), then fail with advice. TORCHYARD_ARCHIVE_ATTEMPTS
# sets another number of attempts.
ARCHIVE_ATTEMPTS = 11
ARCHIVE_BACKOFF_SECONDS = 0.5
ARCHIVE_BACKOFF_MAX = 8.0


class UploadError(OSError):
    """The registry service answered an upload with HTTP error ``status``."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"HTTP {status}: {text}" if text else f"HTTP {status}")
        self.status = status


def _relative_dir(dirpath: str, folder: str) -> str:
    rel = os.path.relpath(dirpath, folder).replace(os.sep, "/")
    return "" if rel == "." else rel + "/"


def _upload_retrying(
    url: str,
    path: str,
    token: str,
    context: ssl.SSLContext | None = None,
    attempts: int = ARCHIVE_ATTEMPTS,
) -> None:
    """:func:`upload_file`, again after a connection error or a 5xx (the service may be
    restarting); any other answer is final."""
    for attempt in range(1, attempts + 1):
        try:
            upload_file(url, path, token, context)
            return
        except UploadError as err:
            if err.status < 500 or attempt == attempts:
                raise
        except OSError:
            if attempt == attempts:
                raise
        time.sleep(min(ARCHIVE_BACKOFF_SECONDS * 2 ** (attempt - 1), ARCHIVE_BACKOFF_MAX))


def archive_advice(err: OSError, *, url: str, namespace: str, run: str) -> str:
    """What an upload error means and what to fix (for the termination message)."""
    if not isinstance(err, UploadError):
        return (
            f"the registry service at {url} is not reachable ({err}): check "
            "TORCHYARD_REGISTRY_URL, that the service runs, and that no NetworkPolicy "
            "blocks the node Pods"
        )
    if err.status == 401:
        fix = (
            "the registry did not accept the Pod's token (audience torchyard-registry): "
            "check that the registry service may create TokenReviews"
        )
    elif err.status == 403:
        fix = (
            f"the registry refused this Pod's ServiceAccount writing run {run} in namespace "
            f"{namespace}: set spec.serviceAccountName to the ServiceAccount the run may "
            "archive as, and grant that one create on modelversions in the namespace"
        )
    elif err.status == 413:
        fix = "a file is larger than the registry service accepts: write smaller outputs"
    elif err.status >= 500:
        fix = "the registry service kept failing (retried for about a minute): see its log"
    else:
        fix = "the registry service refused the upload"
    return f"{err}; {fix}"


def upload_file(url: str, path: str, token: str, context: ssl.SSLContext | None = None) -> None:
    """PUT one file in one pass: the kernel sends it while a thread hashes it. The
    service answers with the sha256 it computed and keeps the file out of sight until a
    second request confirms that digest (``?commit=later``), so nothing is read twice.
    An https URL is verified with ``context`` (:func:`registry_context`)."""
    import hashlib
    import http.client
    import json
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    conn = (
        http.client.HTTPSConnection(parts.netloc, timeout=300, context=context)
        if url.lower().startswith("https://")
        else http.client.HTTPConnection(parts.netloc, timeout=300)
    )
    auth = {"Authorization": "Bearer " + token}

    def answer() -> dict[str, str]:
        resp = conn.getresponse()
        body = resp.read()
        if resp.status >= 300:
            raise UploadError(resp.status, body[:200].decode("utf-8", "replace").strip())
        return dict(json.loads(body or b"{}"))

    try:
        digest = hashlib.sha256()
        conn.putrequest("PUT", parts.path + "?commit=later")
        conn.putheader("Content-Length", str(os.path.getsize(path)))
        for key, value in auth.items():
            conn.putheader(key, value)
        conn.endheaders()

        # The kernel sends the file (sendfile) while a thread hashes it: two cores, one
        # pass each, and the digest is confirmed before the file becomes visible. The
        # hash reads into one reused 256 KiB buffer, hashed while it is in the CPU's cache.
        def hash_file() -> None:
            view = memoryview(bytearray(256 << 10))
            with open(path, "rb", buffering=0) as h:
                while True:
                    n = h.readinto(view)
                    if not n:
                        break
                    digest.update(view[:n])

        hasher = threading.Thread(target=hash_file, daemon=True)
        hasher.start()
        with open(path, "rb", buffering=0) as f:
            if conn.sock is None:
                raise OSError("not connected")
            if isinstance(conn.sock, ssl.SSLSocket):
                # No sendfile through TLS, and SSLSocket.sendfile's fallback sends 8 KiB
                # at a time: 1 MiB blocks (OpenSSL cuts them into records in C).
                block = memoryview(bytearray(1 << 20))
                while True:
                    n = f.readinto(block)
                    if not n:
                        break
                    conn.sock.sendall(block[:n])
            else:
                conn.sock.sendfile(f)
        hasher.join()
        sent = answer()
        if sent.get("sha256") != digest.hexdigest():
            raise OSError(
                f"sha256 mismatch: sent {digest.hexdigest()}, the service got {sent['sha256']}"
            )
        conn.request(
            "POST",
            parts.path + "?upload=" + urllib.parse.quote(sent["upload"]),
            headers=dict(auth, **{"X-Content-SHA256": digest.hexdigest(), "Content-Length": "0"}),
        )
        answer()
    finally:
        conn.close()


def _member_kind(member: Any) -> str:
    """What a tar member is, in words, when it is neither a file nor a folder."""
    if member.issym():
        return f"a symbolic link (to {member.linkname!r})"
    if member.islnk():
        return f"a hard link (to {member.linkname!r})"
    if member.ischr() or member.isblk():
        return "a device"
    if member.isfifo():
        return "a FIFO"
    return f"an entry of tar type {member.type!r}"


def _snapshot_target(root: str, name: str) -> str:
    """Where member ``name`` goes under ``root``; LaunchError if it could land elsewhere."""
    if "\x00" in name:
        raise LaunchError(f"the snapshot has a name with a NUL byte: {name!r}")
    if name.startswith("/") or os.path.isabs(name):
        raise LaunchError(f"the snapshot has an absolute path: {name!r}")
    if ".." in name.split("/"):
        raise LaunchError(f"the snapshot has a path outside the folder ('..'): {name!r}")
    target = os.path.realpath(os.path.join(root, name))
    if not (target == root or target.startswith(root + os.sep)):
        raise LaunchError(f"the snapshot has a path outside the folder: {name!r}")
    return target


class _Unpacker:
    """The members of one snapshot's tar stream, unpacked under ``root`` one at a time
    within the limits; what it made is taken back by :meth:`undo`."""

    def __init__(self, root: str, max_bytes: int, max_files: int) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.max_files = max_files
        self.created: list[str] = []  # what this unpacking made, to take back on failure
        self.count = self.entries = self.total = 0
        self.name = ""  # the member being unpacked

    def mkdirs(self, path: str) -> None:
        missing = []
        while not os.path.isdir(path):
            missing.append(path)
            path = os.path.dirname(path)
        for folder in reversed(missing):
            os.mkdir(folder)
            self.created.append(folder)

    def member(self, tar: Any, member: Any) -> None:
        """Unpack one member (a folder or a regular file); LaunchError when it is refused."""
        name = self.name = member.name
        self.entries += 1
        if self.entries > self.max_files:
            raise LaunchError(
                f"the snapshot holds more than {self.max_files} entries (at {name!r}); "
                "leave files out of the snapshot (.torchyardignore) or raise "
                f"{TORCHYARD_SNAPSHOT_MAX_FILES}"
            )
        target = _snapshot_target(self.root, name)
        if member.isdir():
            self.mkdirs(target)
            return
        if not member.isfile():
            raise LaunchError(
                f"the snapshot may hold only files and folders: {name!r} is " + _member_kind(member)
            )
        if target == self.root:
            raise LaunchError(f"the snapshot has a file without a name: {name!r}")
        # A stream member is exactly as long as its header says: checked before a byte of
        # it is inflated.
        self.total += member.size
        if self.total > self.max_bytes:
            raise LaunchError(
                f"the snapshot unpacks to more than {self.max_bytes} bytes (at {name!r}, "
                f"{member.size} bytes); leave large files out of the snapshot "
                "(.torchyardignore) or raise TORCHYARD_SNAPSHOT_MAX_BYTES"
            )
        self.mkdirs(os.path.dirname(target))
        source = tar.extractfile(member)
        if source is None:  # no regular file reads as None: its mutants are equivalent
            raise LaunchError(f"cannot read {name!r} from the snapshot")  # pragma: no mutate
        self.write(source, target, member.mode)

    def write(self, source: Any, target: str, mode: int) -> None:
        existed = os.path.lexists(target)
        # O_NOFOLLOW: never write through a link that is already there. No mutate: target
        # is resolved (_snapshot_target), so the flag only closes the race of a link made
        # after that, which no test stages; the mode is set by chmod below.
        nofollow = getattr(os, "O_NOFOLLOW", 0)  # pragma: no mutate
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | nofollow  # pragma: no mutate
        fd = os.open(target, flags, 0o600)  # pragma: no mutate
        if not existed:
            self.created.append(target)
        with source, os.fdopen(fd, "wb") as out:
            while True:
                block = source.read(1 << 20)  # pragma: no mutate (any size copies the same)
                if not block:
                    break
                out.write(block)
        os.chmod(target, 0o755 if mode & 0o111 else 0o644)
        self.count += 1

    def undo(self) -> None:
        for path in reversed(self.created):
            with contextlib.suppress(OSError):
                if os.path.isdir(path) and not os.path.islink(path):
                    os.rmdir(path)
                else:
                    os.unlink(path)


def extract_snapshot(
    archive: str,
    workdir: str,
    max_bytes: int | None = None,
    max_files: int | None = None,
) -> int:
    """Unpack a ``torchyard submit`` snapshot into ``workdir``; the number of files.

    Only regular files and folders, every path inside ``workdir``: absolute names, ``..``,
    NUL bytes, symbolic and hard links, devices and FIFOs are refused. The archive is read
    as a stream and stops at ``max_bytes`` unpacked bytes or ``max_files`` entries (by
    default :func:`snapshot_limits`), so a small archive that unpacks to a huge one (a
    "gzip bomb") costs neither the disk nor minutes. On any refusal LaunchError names the
    entry, and what was unpacked so far is removed again.
    """
    import tarfile
    import zlib

    default_bytes, default_files = snapshot_limits()
    os.makedirs(workdir, exist_ok=True)
    unpacker = _Unpacker(
        os.path.realpath(workdir),
        default_bytes if max_bytes is None else max_bytes,
        default_files if max_files is None else max_files,
    )
    try:
        with tarfile.open(archive, "r|gz") as tar:
            for member in tar:
                unpacker.member(tar, member)
    except BaseException as err:
        unpacker.undo()
        if isinstance(err, (tarfile.TarError, EOFError, zlib.error, OSError)):
            where = f" (at {unpacker.name!r})" if unpacker.name else ""
            raise LaunchError(f"cannot unpack the snapshot {archive}{where}: {err}") from None
        raise
    return unpacker.count


def fetch_snapshot(
    url: str, sha256: str, workdir: str, token: str, context: ssl.SSLContext | None = None
) -> int:
    """Download a snapshot from the registry service (an https URL verified with
    ``context``), check its sha256, unpack it."""
    import hashlib
    import tempfile
    import urllib.request

    request = urllib.request.Request(url, headers={"Authorization": "Bearer " + token})
    digest = hashlib.sha256()
    # One reused 256 KiB buffer, read into, hashed and written while it is in the CPU's
    # cache (no new bytes object per block).
    view = memoryview(bytearray(256 << 10))
    with tempfile.NamedTemporaryFile(suffix=".tar.gz") as tmp:
        try:
            with urllib.request.urlopen(request, timeout=300, context=context) as resp:
                while True:
                    n = resp.readinto(view)
                    if not n:
                        break
                    digest.update(view[:n])
                    tmp.write(view[:n])
        except OSError as err:
            raise LaunchError(f"cannot download the source snapshot {url}: {err}") from None
        tmp.flush()
        if digest.hexdigest() != sha256:
            raise LaunchError(
                f"the source snapshot's sha256 is {digest.hexdigest()}, expected {sha256}"
            )
        return extract_snapshot(tmp.name, workdir)


SOURCE_OPTIONS = ("--copy", "--fetch")


def prepare(args: Sequence[str], termination_log: str | None = None) -> int:
    """``--copy SRC DIR | --fetch SHA256 DIR``: the source, before the ranks start.

    With ``--copy`` the code of a ConfigMap volume SRC goes into the writable working
    folder DIR (unpacking a ``torchyard submit`` snapshot); with ``--fetch`` the snapshot
    SHA256 is downloaded from the registry service (TORCHYARD_REGISTRY_URL,
    TORCHYARD_NAMESPACE, TORCHYARD_REGISTRY_TOKEN_FILE and, over https,
    TORCHYARD_REGISTRY_CA), checked and unpacked into DIR. 0 when done, 1 when the source
    was refused or unreachable (said on stderr, and in ``termination_log`` as a
    LaunchError), 2 for other arguments.
    """
    import shutil

    rest = list(args)
    try:
        if rest[:1] == ["--copy"] and len(rest) == 3:
            src, workdir = rest[1], rest[2]
            os.makedirs(workdir, exist_ok=True)
            if os.path.isfile(os.path.join(src, SNAPSHOT)):
                count = extract_snapshot(os.path.join(src, SNAPSHOT), workdir)
                sys.stderr.write(f"[torchyard] unpacked the source snapshot: {count} files\n")
                return 0
            for entry in os.listdir(src):
                if entry.startswith(".."):  # a ConfigMap volume's own bookkeeping links
                    continue
                path = os.path.join(src, entry)
                target = os.path.join(workdir, entry)
                if os.path.isdir(path):
                    shutil.copytree(path, target, dirs_exist_ok=True)
                else:
                    shutil.copyfile(path, target)
        elif rest[:1] == ["--fetch"] and len(rest) == 3:
            sha256, workdir = rest[1], rest[2]
            env = os.environ
            with open(env.get(TORCHYARD_REGISTRY_TOKEN_FILE, "")) as f:
                token = f.read().strip()
            url = (
                f"{env[TORCHYARD_REGISTRY_URL].rstrip('/')}/v1/namespaces/"
                f"{env.get(TORCHYARD_NAMESPACE, 'default')}/snapshots/{sha256}"
            )
            count = fetch_snapshot(url, sha256, workdir, token, registry_context(env))
            sys.stderr.write(f"[torchyard] fetched the source snapshot: {count} files\n")
        else:
            sys.stderr.write(f"[torchyard] error: unexpected arguments {rest}\n")
            return 2
    except (LaunchError, OSError, KeyError) as err:
        sys.stderr.write(f"[torchyard] error: {err}\n")
        if termination_log:
            write_termination(
                termination_log,
                termination_message(
                    {"reason": "LaunchError", "exitCode": 1, "message": f"the source: {err}"}
                ),
            )
        return 1
    return 0


def copy_inputs(env: Mapping[str, str]) -> int:
    """The ``download`` inputs (``TORCHYARD_INPUTS_COPIES``: ``[[from, to], ...]``,
    read-only cache entries and the writable folders they go to), copied before the
    ranks start; the files copied. LaunchError when one cannot be."""
    import json
    import shutil

    raw = env.get(TORCHYARD_INPUTS_COPIES, "")
    if not raw:
        return 0
    count = 0
    try:
        for source, target in json.loads(raw):
            shutil.copytree(source, target, dirs_exist_ok=True, symlinks=True)
            count += sum(len(files) for _, _, files in os.walk(target))
    except (OSError, ValueError, TypeError) as err:
        raise LaunchError(f"cannot copy the inputs to download: {err}") from None
    return count


def archive(
    env: Mapping[str, str], node_rank: int, logs: str, say: Callable[[str], None]
) -> str | None:
    """Upload this node's logs (and node 0's outputs) to the registry service.

    Runs whether the ranks succeeded or not. Returns None when every file arrived, else
    what went wrong and what to fix (:func:`archive_advice`), which ``say`` is told too.
    A connection error or a 5xx is tried again; one that persists, or a refused token
    (401/403), stops the uploads at once.
    """
    url = env[TORCHYARD_REGISTRY_URL].rstrip("/")
    namespace = env.get(TORCHYARD_NAMESPACE, "default")
    run = env.get(TORCHYARD_RUN, "run")
    base = f"{url}/v1/namespaces/{namespace}/runs/{run}"
    token_file = env.get(TORCHYARD_REGISTRY_TOKEN_FILE, "")
    try:
        with open(token_file) as f:
            token = f.read().strip()
    except OSError as err:
        return _say_problem(
            say,
            f"cannot archive to the model registry: no registry token at {token_file!r} "
            f"({err.strerror}); node Pods get one (audience torchyard-registry) when the "
            "operator archives to a registry: run this through a TrainingRun",
        )
    try:
        context = registry_context(env)
    except (OSError, ValueError) as err:  # ssl.SSLError is an OSError
        return _say_problem(
            say, f"cannot archive: TORCHYARD_REGISTRY_CA is not a PEM certificate ({err})"
        )
    folders = [(logs, f"logs/node-{node_rank}")]
    if node_rank == 0:
        folders.append((env[TORCHYARD_OUTPUTS], "outputs"))
    files = [
        (os.path.join(dirpath, name), f"{prefix}/{_relative_dir(dirpath, folder)}{name}")
        for folder, prefix in folders
        for dirpath, _, names in os.walk(folder)
        for name in sorted(names)
    ]
    attempts = max(1, int_env(env, TORCHYARD_ARCHIVE_ATTEMPTS, ARCHIVE_ATTEMPTS))
    sent, failed = 0, []
    first: OSError | None = None
    for path, target in files:
        try:
            _upload_retrying(f"{base}/{target}", path, token, context, attempts=attempts)
            sent += 1
        except OSError as err:
            failed.append(target)
            first = first or err
            if not isinstance(err, UploadError) or err.status in (401, 403):
                break  # unreachable, or the token refused: so would every other file be
    if first is None:
        say(f"archived {sent} file(s) to the registry")
        return None
    return _say_problem(
        say,
        f"archiving to the model registry failed: {len(files) - sent} of {len(files)} "
        f"file(s) not uploaded (first: {failed[0]}): "
        + archive_advice(first, url=url, namespace=namespace, run=run),
    )


def _say_problem(say: Callable[[str], None], problem: str) -> str:
    say(problem)
    return problem


def archive_node(
    env: Mapping[str, str], node_rank: int, logs: str, code: int, say: Callable[[str], None]
) -> int:
    """With TORCHYARD_REGISTRY_URL, :func:`archive` the node; the node's exit code: ``code``,
    unless the ranks succeeded and the archive did not (:func:`archive_failed`)."""
    if env.get(TORCHYARD_REGISTRY_URL):
        problem = archive(env, node_rank, logs, say)
        if problem is not None and code == 0:
            code = archive_failed(env, problem, node_rank)
    return code


def archive_failed(env: Mapping[str, str], problem: str, node_rank: int) -> int:
    """The ranks succeeded but the archive did not: say so in the termination message
    (reason ArchiveFailed). With TORCHYARD_OUTPUTS_OPTIONAL the node still succeeds
    (the operator turns the message into a warning); otherwise it fails."""
    optional = env.get(TORCHYARD_OUTPUTS_OPTIONAL, "") not in ("", "0", "false")
    code = 0 if optional else ARCHIVE_FAILED_EXIT
    path = env.get(TORCHYARD_TERMINATION_LOG, TERMINATION_LOG)
    info = {"nodeRank": node_rank, "exitCode": code, "reason": "ArchiveFailed"}
    write_termination(path, termination_message(dict(info, message=problem)))
    return code
