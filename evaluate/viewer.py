"""`trajlake view`: the trajectory viewer, served on 127.0.0.1 or exported as static files.

Served: `/` (runs), `/run?id=<run id>` (its episodes), `/episode?id=<id>`, `/compare?a=ID&b=ID[&spec_b=SPEC]`;
every page takes `?spec=SPEC_ID` (default: the last spec scored). `/run/<id>` and `/episode/<id>` work too,
but the pages link with the query form: a browser collapses a path segment `.` or `..`, however encoded.
The lake is read at one snapshot pinned when the viewer starts (`--snapshot` to choose), so what a page shows
does not move while new runs land.
Exported (`--out DIR`): `index.html`, `runs/<run>.html`, `episodes/<id>.html` (ids encoded into one safe
file name each, every written path checked to lie inside DIR), the same pages with relative links, under one
spec, for sharing. Pages escape everything they show and carry a Content-Security-Policy (viewer_html.py).
"""

from __future__ import annotations

import errno
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

from trajlake.core.errors import TrajlakeError
from trajlake.evaluate.viewer_html import CSP_HEADER, error_page
from trajlake.evaluate.viewer_pages import Links, Pages
from trajlake.store.reads import latest_spec

#: the addresses that reach only this machine (a viewer bound to one checks the Host of each request)
LOOPBACK = ("127.0.0.1", "::1")


def _pin(lake, snapshot: int | None) -> int:
    if snapshot is None:
        return lake.current_snapshot()
    if snapshot not in lake.snapshots()["snapshot_id"].to_list():
        raise TrajlakeError(f"snapshot {snapshot} is not a snapshot of the lake (trajlake snapshots lists them)")
    return snapshot


def _inside(root: Path, path: Path) -> Path:
    """`path` if it resolves inside `root` (itself resolved); else a TrajlakeError: a link planted in the
    output folder must not carry a page elsewhere."""
    real = path.resolve()
    if real != root and not real.is_relative_to(root):
        raise TrajlakeError(f"{path} leads outside the output folder {root} (a link?); remove it or pick another "
                            "folder")
    return real


def _write(root: Path, folder: str, name: str, text: str) -> None:
    """Write `root/folder/name`, checked to lie inside `root`; O_NOFOLLOW: a link planted at the file's own
    name is refused by the kernel, not followed."""
    parent = _inside(root, root / folder) if folder else root
    target = parent / name
    if target.parent != parent or name in ("", ".", ".."):  # a name from path_component never does this
        raise TrajlakeError(f"page name {name!r} is not one file name")
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        why = "it is a link" if e.errno == errno.ELOOP else (e.strerror or str(e))
        raise TrajlakeError(f"cannot write viewer page {target}: {why}") from None


def _out_folder(out: str | Path) -> Path:
    """The export folder, created and resolved (symlinks followed once, here, so every check below compares
    real paths), with its runs/ and episodes/ folders inside it."""
    root = Path(out).expanduser()
    if root.exists() and not root.is_dir():
        raise TrajlakeError(f"viewer output {root} is a file; pass a folder (it is created if missing)")
    try:
        root.mkdir(parents=True, exist_ok=True)
        root = root.resolve(strict=True)
        for sub in ("runs", "episodes"):
            (root / sub).mkdir(exist_ok=True)
            _inside(root, root / sub)
    except OSError as e:
        raise TrajlakeError(f"cannot create viewer folder {root}: {e.strerror or e}") from None
    return root


def export_site(lake, out: str | Path, *, snapshot: int | None = None, spec: str | None = None,
                max_episodes: int = 5000) -> int:
    """Write the viewer's pages to folder `out` (runs, every run's episodes, up to `max_episodes` episode
    pages); returns how many episode pages. Page names come from `Links.page_file` (ids encoded by
    `path_component`), so no id, whatever it holds, names a file outside `out`."""
    snap = _pin(lake, snapshot)
    pages = Pages(lake, snap, spec or latest_spec(lake, snapshot=snap), Links(static=True))
    pages.check_spec(spec)
    root = _out_folder(out)
    _write(root, "", "index.html", pages.runs())
    runs = lake.query("SELECT DISTINCT run_id FROM episodes ORDER BY 1", snapshot=snap)["run_id"].to_list()
    for run_id in runs:
        _write(root, "runs", Links.page_file(run_id), pages.run(run_id))
    ids = lake.query("SELECT episode_id FROM episodes ORDER BY episode_id LIMIT ?", [int(max_episodes)],
                     snapshot=snap)["episode_id"].to_list()
    for eid in ids:
        _write(root, "episodes", Links.page_file(eid), pages.episode(eid))
    return len(ids)


class Viewer:
    """The served viewer: one lake, one pinned snapshot, pages rendered on request (one at a time: a lake
    connection serves one query at a time)."""

    def __init__(self, lake, *, snapshot: int | None = None, port: int = 8765, host: str = "127.0.0.1"):
        self.lake, self.host = lake, host
        self.snapshot = _pin(lake, snapshot)
        self.spec = latest_spec(lake, snapshot=self.snapshot)  # the spec last scored
        self.lock = threading.Lock()
        viewer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                if not viewer.host_allowed(self.headers.get("Host")):
                    self.send_error(421, "Misdirected Request", "this viewer answers only to its own address")
                    return
                try:
                    status, body = viewer.render(self.path)
                except Exception as e:  # a bug or a lake fault: one line on the console, a page without details
                    sys.stderr.write(f"trajlake view: {type(e).__name__}: {e}\n")
                    status, body = 500, error_page("Server error", "the page failed; the console says why")
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def end_headers(self):
                """Every response, http.server's own error pages too: the page's policy plus what only a header
                can say (no framing), no type sniffing, no referrer."""
                self.send_header("Content-Security-Policy", CSP_HEADER)
                self.send_header("X-Content-Type-Options", "nosniff")
                self.send_header("Referrer-Policy", "no-referrer")
                super().end_headers()

            def log_message(self, *args):
                """Quiet: `trajlake view` prints its own line, not one per request."""

        try:
            self.server = ThreadingHTTPServer((host, port), Handler)
        except OSError as e:
            raise TrajlakeError(f"cannot serve on {host}:{port}: {e.strerror} (give another --port)") from None
        self.url = f"http://{host}:{self.server.server_address[1]}/"

    def host_allowed(self, host_header: str | None) -> bool:
        """Served on a loopback address, the viewer answers only requests addressed to one: a web page whose
        domain was re-pointed at 127.0.0.1 (DNS rebinding) would otherwise read the lake through it."""
        if self.host not in LOOPBACK:
            return True
        try:
            name = urlparse(f"//{host_header or ''}").hostname
        except ValueError:  # "[" without its "]": no address at all
            return False
        return name in LOOPBACK or name == "localhost"

    def render(self, path: str) -> tuple[int, str]:
        url = urlparse(path)
        q = {k: v[0] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        parts = [unquote(p) for p in url.path.strip("/").split("/", 1) if p]
        if len(parts) == 1 and "id" in q:  # /run?id=ID: the form the pages link to (any id, "." and ".." too)
            parts.append(q["id"])
        spec = q.get("spec") or None  # ?spec= (blank): the default
        pages = Pages(self.lake, self.snapshot, spec or self.spec, Links(static=False))
        try:
            with self.lock:
                pages.check_spec(spec)
                if not parts:
                    return 200, pages.runs()
                if parts[0] == "run" and len(parts) == 2:
                    return 200, pages.run(parts[1])
                if parts[0] == "episode" and len(parts) == 2:
                    return 200, pages.episode(parts[1])
                if parts[0] == "compare" and "a" in q and "b" in q:
                    return 200, pages.compare(q["a"], q["b"], q.get("spec_b") or None)
        except TrajlakeError as e:  # the message names what was asked for: escaped by error_page
            return 404, error_page("Not found", str(e))
        # the path itself is not echoed (a page that repeats its URL is the classic reflection)
        return 404, error_page("Not found", "no such page")

    def serve(self) -> None:
        self.server.serve_forever()

    def start(self) -> threading.Thread:
        """Serve on a background thread (tests, notebooks); `close()` stops it."""
        t = threading.Thread(target=self.serve, daemon=True)
        t.start()
        return t

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


__all__ = ["Viewer", "export_site"]
