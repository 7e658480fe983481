"""Env servers are untrusted (docs/threat-model.md): a reply without end, one dripped a byte at a time, JSON
nested past the parser, and a request body the server would have to allocate whole each end in one error, in
bounded time and memory (collect/envs/http_replies.py, collect/envs/agentgym_server.py)."""

from __future__ import annotations

import contextlib
import json
import threading
import time

import pytest

from trajlake.collect.envs.agentgym_client import AgentGymClient, EnvServerError
from trajlake.collect.envs.agentgym_server import serve_env

FAST = {"timeout": 2.0, "connect_timeout": 1.0, "retries": 2, "backoff": 0.05}


def _hostile_server(reply):
    """A server whose every POST and GET is answered by `reply(handler)` (it writes the status, headers and
    body itself); (url, stop)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Hostile(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client hung up, as it should
                reply(self)

        do_GET = do_POST

        def log_message(self, *args):
            return None

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()

    def stop():
        srv.shutdown()
        srv.server_close()

    return f"http://127.0.0.1:{srv.server_address[1]}", stop


def _endless(handler):
    """A chunked body that never ends (a JSON string growing forever)."""
    handler.send_response(200)
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    piece = b'"' + b"x" * (1 << 20)
    while True:
        handler.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        piece = b"x" * (1 << 20)


def _drip(handler):
    """A byte every 0.2 s, each well within the read timeout, for ever."""
    handler.send_response(200)
    handler.send_header("Content-Length", str(1 << 20))
    handler.end_headers()
    while True:
        handler.wfile.write(b" ")
        handler.wfile.flush()
        time.sleep(0.2)


def _deep(handler):
    body = b"[" * 100_000 + b"]" * 100_000
    handler.send_response(200)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


@pytest.mark.parametrize("reply,message", [(_endless, "larger than 16 MiB"), (_drip, "still arriving 1s after"),
                                           (_deep, "nests too deep")], ids=["endless", "drip", "deep"])
def test_a_hostile_reply_is_an_env_error_in_bounded_time_and_memory(reply, message):
    """Env servers are untrusted: a body without end, one that drips a byte at a time inside the read timeout,
    and JSON nested past the parser's recursion each end in EnvServerError naming the cause, within about the
    timeout, having read at most MAX_REPLY_BYTES (requests reads a body whole, and its timeout bounds only the gap
    between two bytes). A step is not sent again: the server answered."""
    import resource

    url, stop = _hostile_server(reply)
    try:
        client = AgentGymClient(url, "webshop", timeout=1.0, connect_timeout=1.0, retries=2, backoff=0.05)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        start = time.monotonic()
        with pytest.raises(EnvServerError, match=message):
            client._request("POST", "step", {"action": "x"}, idempotent=False)
        assert time.monotonic() - start < 10
        grew_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
        assert grew_mib < 200, f"peak RSS grew {grew_mib:.0f} MiB"
    finally:
        stop()


@pytest.mark.parametrize("length", ["1000000000000", "-5", "abc"])
def test_the_server_refuses_a_body_it_would_have_to_allocate_whole(length):
    """`rfile.read(n)` allocates n bytes before reading: a Content-Length of a terabyte was a MemoryError (or
    20 GB held), a negative one read until the client hung up. Refused as an error reply; the server serves on."""
    import http.client

    srv = serve_env("doors")
    try:
        con = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        con.putrequest("POST", "/create")
        con.putheader("Content-Length", length)
        con.endheaders()
        reply = json.loads(con.getresponse().read())
        assert "at most" in reply["error"] and "Content-Length" in reply["error"], reply
        con.close()
        assert AgentGymClient(srv.url, "trajlake", **FAST).tasks("test", n=1)  # still serving
    finally:
        srv.stop()
