"""`trajlake view`: the trajectory viewer, served on 127.0.0.1 or exported as static files.

Served: `/` (runs), `/run?id=<run id>` (its episodes, RUN_PAGE_ROWS a page: `&page=N` for the Nth),
`/episode?id=<id>`, `/compare?a=ID&b=ID[&spec_b=SPEC]`, `/train?id=<train run>` (its curves, evals, config,
policies and steps; `/run?id=` of a train run answers it too), `/evals?id=<train run>` (its evals compared task
by task), `/evals?a=EVAL&b=EVAL` (two eval runs compared), `/trained?id=<train run>&step=N` (the episodes a step
trained on); every page takes `?spec=SPEC_ID` (default: the last spec scored). `/run/<id>` and `/episode/<id>`
work too, but the pages link with the query form: a browser collapses a path segment `.` or `..`, however
encoded. The lake is read at one snapshot pinned when the viewer starts (`--snapshot` to choose), so what a
page shows does not move while new runs land.
Exported (`--out DIR`, export.py): `index.html`, `runs/<run>.html` (and `<run>%pN.html` for the parts
of a long run), `train/<run>.html`, `evals/<run>.html` and `trained/<run>%sN.html` of each train run,
`episodes/<id>.html` (ids encoded into one safe file name each, every written path checked to lie inside DIR),
the same pages with relative links, under one spec, for sharing, read in a few bulk queries. Pages escape
everything they show and carry a Content-Security-Policy (markup.py).
"""

from __future__ import annotations

import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse

from trajlake.core.errors import TrajlakeError
from trajlake.store.reads import latest_spec, reward_spec_names
from trajlake.view.export import _pin, export_site
from trajlake.view.markup import CSP_HEADER, error_page
from trajlake.view.pages import Links, Pages

#: the addresses that reach only this machine (a viewer bound to one checks the Host of each request)
LOOPBACK = ("127.0.0.1", "::1")


def _part(value: str | None) -> int:
    """A run page's `?page=N` (absent or blank: 1); anything but a whole number is a 404 that names it."""
    if not value:
        return 1
    if not value.isdigit() or len(value) > 9:
        raise TrajlakeError(f"no page {value!r}: pages are numbered from 1")
    return int(value)


def _step(value: str | None) -> int:
    """A trained-on page's `?step=N`: a whole number, else a 404 that names it."""
    if not value or not value.isdigit() or len(value) > 18:
        raise TrajlakeError(f"no step {value!r}: give the step as a whole number (&step=N)")
    return int(value)


class Viewer:
    """The served viewer: one lake, one pinned snapshot, pages rendered on request (one at a time: a lake
    connection serves one query at a time)."""

    def __init__(self, lake, *, snapshot: int | None = None, port: int = 8765, host: str = "127.0.0.1"):
        self.lake, self.host = lake, host
        self.snapshot = _pin(lake, snapshot)
        self.spec = latest_spec(lake, snapshot=self.snapshot)  # the spec last scored
        # the specs at the pinned snapshot cannot change: read once, not on every page
        self.specs = reward_spec_names(lake, snapshot=self.snapshot)
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
        self._serving = False  # socketserver's shutdown() waits for a serve_forever loop: none, it waits forever

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
        pages = Pages(self.lake, self.snapshot, spec or self.spec, Links(static=False), specs=self.specs)
        try:
            with self.lock:
                pages.check_spec(spec)
                if not parts:
                    return 200, pages.runs()
                if parts[0] == "run" and len(parts) == 2:
                    return 200, pages.run(parts[1], _part(q.get("page")))
                if parts[0] == "episode" and len(parts) == 2:
                    return 200, pages.episode(parts[1])
                if parts[0] == "compare" and "a" in q and "b" in q:
                    return 200, pages.compare(q["a"], q["b"], q.get("spec_b") or None)
                if parts[0] == "train" and len(parts) == 2:
                    return 200, pages.train(parts[1])
                if parts[0] == "evals" and len(parts) == 2:
                    return 200, pages.evals(parts[1])
                if parts[0] == "evals" and "a" in q and "b" in q:
                    return 200, pages.eval_pair(q["a"], q["b"])
                if parts[0] == "trained" and len(parts) == 2:
                    return 200, pages.trained(parts[1], _step(q.get("step")))
        except TrajlakeError as e:  # the message names what was asked for: escaped by error_page
            return 404, error_page("Not found", str(e))
        # the path itself is not echoed (a page that repeats its URL is the classic reflection)
        return 404, error_page("Not found", "no such page")

    def serve(self) -> None:
        """Serve in this thread until interrupted (Ctrl-C) or until close() from another thread."""
        self._serving = True
        try:
            self.server.serve_forever()
        finally:  # its loop is over (or never began): close() has nothing to wait for
            self._serving = False

    def start(self) -> threading.Thread:
        """Serve on a background thread (tests, notebooks); `close()` stops it."""
        self._serving = True  # before the thread runs: a close() right after start() still waits for its loop
        t = threading.Thread(target=self.server.serve_forever, daemon=True)
        t.start()
        return t

    def close(self) -> None:
        """Stop serving (when it served: also after a Ctrl-C that came before its loop began) and free the port."""
        if self._serving:
            self.server.shutdown()
            self._serving = False
        self.server.server_close()


__all__ = ["Viewer", "export_site"]
