"""`trajlake view`: the trajectory viewer, served on 127.0.0.1 or exported as static files.

Served: `/` (runs), `/run/<run id>` (its episodes), `/episode/<id>`, `/compare?a=ID&b=ID[&spec_b=SPEC]`; every
page takes `?spec=SPEC_ID` (default: the last spec scored). The lake is read at one snapshot pinned when the
viewer starts (`--snapshot` to choose), so what a page shows does not move while new runs land.
Exported (`--out DIR`): `index.html`, `runs/<run>.html`, `episodes/<id>.html`, the same pages with relative
links, under one spec, for sharing.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlparse

from trajlake.errors import TrajlakeError
from trajlake.evaluate.viewer_pages import Links, Pages, page


def default_spec(lake, snapshot: int) -> str | None:
    """The spec last scored at `snapshot` (None: nothing scored)."""
    rows = lake.query("SELECT spec_id FROM reward_specs ORDER BY created_at DESC, spec_id LIMIT 1", snapshot=snapshot)
    return rows.item() if rows.height else None


def _pin(lake, snapshot: int | None) -> int:
    if snapshot is None:
        return lake.current_snapshot()
    if snapshot not in lake.snapshots()["snapshot_id"].to_list():
        raise TrajlakeError(f"snapshot {snapshot} is not a snapshot of the lake (trajlake snapshots lists them)")
    return snapshot


def export_site(lake, out: str | Path, *, snapshot: int | None = None, spec: str | None = None,
                max_episodes: int = 5000) -> int:
    """Write the viewer's pages to folder `out` (runs, every run's episodes, up to `max_episodes` episode
    pages); returns how many episode pages."""
    snap = _pin(lake, snapshot)
    pages = Pages(lake, snap, spec or default_spec(lake, snap), Links(static=True))
    out = Path(out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    (out / "episodes").mkdir(exist_ok=True)
    (out / "index.html").write_text(pages.runs())
    runs = lake.query("SELECT DISTINCT run_id FROM episodes ORDER BY 1", snapshot=snap)["run_id"].to_list()
    for run_id in runs:
        (out / "runs" / f"{quote(run_id, safe='')}.html").write_text(pages.run(run_id))
    ids = lake.query(f"SELECT episode_id FROM episodes ORDER BY episode_id LIMIT {int(max_episodes)}",
                     snapshot=snap)["episode_id"].to_list()
    for eid in ids:
        (out / "episodes" / f"{eid}.html").write_text(pages.episode(eid))
    return len(ids)


class Viewer:
    """The served viewer: one lake, one pinned snapshot, pages rendered on request (one at a time: a lake
    connection serves one query at a time)."""

    def __init__(self, lake, *, snapshot: int | None = None, port: int = 8765, host: str = "127.0.0.1"):
        self.lake = lake
        self.snapshot = _pin(lake, snapshot)
        self.spec = default_spec(lake, self.snapshot)
        self.lock = threading.Lock()
        viewer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                status, body = viewer.render(self.path)
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                """Quiet: `trajlake view` prints its own line, not one per request."""

        try:
            self.server = ThreadingHTTPServer((host, port), Handler)
        except OSError as e:
            raise TrajlakeError(f"cannot serve on {host}:{port}: {e.strerror} (give another --port)") from None
        self.url = f"http://{host}:{self.server.server_address[1]}/"

    def render(self, path: str) -> tuple[int, str]:
        url = urlparse(path)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        parts = [unquote(p) for p in url.path.strip("/").split("/", 1) if p]
        pages = Pages(self.lake, self.snapshot, q.get("spec") or self.spec, Links(static=False))
        try:
            with self.lock:
                if not parts:
                    return 200, pages.runs()
                if parts[0] == "run" and len(parts) == 2:
                    return 200, pages.run(parts[1])
                if parts[0] == "episode" and len(parts) == 2:
                    return 200, pages.episode(parts[1])
                if parts[0] == "compare" and "a" in q and "b" in q:
                    return 200, pages.compare(q["a"], q["b"], q.get("spec_b"))
        except TrajlakeError as e:
            return 404, page("not found", f"<h1>Not found</h1><p>{e}</p><p><a href='/'>runs</a></p>")
        return 404, page("not found", f"<h1>Not found</h1><p>no page {path}</p><p><a href='/'>runs</a></p>")

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


__all__ = ["Viewer", "export_site", "default_spec"]
