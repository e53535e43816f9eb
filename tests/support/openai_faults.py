"""A small, real HTTP server that speaks just enough of the OpenAI chat API to misbehave.

Each fault lives under its own path prefix, so one server serves every test:
`http://127.0.0.1:PORT/<fault>/v1`. Faults: `ok`, `401`, `403`, `404` (chat endpoint unknown),
`nomodel` (the model list lacks the model), `429then` (two 429s, then a normal stream), `500`,
`cut` (three chunks, then the connection drops mid-body), `garbage` (two chunks, then a chunk
that is not JSON), `llamacpp` (a normal stream with what llama-server adds: a prefill progress
chunk, `timings` in the last chunk, then a usage chunk). Every request's headers are recorded,
so a test can check what was sent.
"""

from __future__ import annotations

import json
import socket
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "fake-model"
WORDS = ["Hello", " from", " the", " fake", " server", "."]
LLAMACPP_TIMINGS = {
    "prompt_n": 5,
    "cache_n": 12,
    "prompt_ms": 4.0,
    "prompt_per_second": 1250.0,
    "predicted_n": 6,
    "predicted_ms": 60.0,
    "predicted_per_second": 100.0,
    "draft_n": 4,
    "draft_n_accepted": 3,
}


def _chunk(content: str | None = None, finish: str | None = None) -> bytes:
    delta = {} if content is None else {"content": content}
    body = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return f"data: {json.dumps(body)}\n\n".encode()


class FaultServer:
    def __init__(self) -> None:
        self.headers: list[dict[str, str]] = []
        self.calls: Counter[str] = Counter()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def _fault(self) -> str:
                return self.path.strip("/").split("/", 1)[0]

            def _json(self, status: int, body: dict[str, Any], extra: dict[str, str] | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (extra or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _error(self, status: int, message: str, extra: dict[str, str] | None = None) -> None:
                self._json(status, {"error": {"message": message, "type": "fake", "code": status}}, extra)

            def do_GET(self) -> None:
                server.headers.append(dict(self.headers))
                fault = self._fault()
                if fault in ("401", "403"):
                    self._error(int(fault), "no")
                    return
                ids = ["other-model"] if fault == "nomodel" else [MODEL]
                self._json(200, {"object": "list", "data": [{"id": i, "object": "model"} for i in ids]})

            def do_POST(self) -> None:
                server.headers.append(dict(self.headers))
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                fault = self._fault()
                server.calls[fault] += 1
                if fault == "404":
                    self._error(404, "not found")
                    return
                if fault == "500":
                    self._error(500, "the backend crashed", {"retry-after-ms": "10"})
                    return
                if fault == "429then" and server.calls[fault] <= 2:
                    self._error(429, "slow down", {"retry-after-ms": "10"})
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                words = WORDS[:3] if fault in ("cut", "garbage") else WORDS
                if fault == "llamacpp":
                    progress = {"total": 17, "cache": 12, "processed": 17, "time_ms": 4.0}
                    self._send(
                        f"data: {json.dumps({'choices': [], 'prompt_progress': progress})}\n\n".encode()
                    )
                for w in words:
                    self._send(_chunk(w))
                if fault == "cut":  # drop the connection in the middle of the body
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if fault == "garbage":
                    self._send(b"data: {this is not json\n\n")
                elif fault == "llamacpp":
                    last = json.loads(_chunk(finish="stop")[6:])
                    last["timings"] = LLAMACPP_TIMINGS
                    self._send(f"data: {json.dumps(last)}\n\n".encode())
                    usage = {
                        "prompt_tokens": 17,
                        "completion_tokens": 6,
                        "total_tokens": 23,
                        "prompt_tokens_details": {"cached_tokens": 12},
                    }
                    self._send(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
                    self._send(b"data: [DONE]\n\n")
                else:
                    self._send(_chunk(finish="stop"))
                    self._send(b"data: [DONE]\n\n")
                self.wfile.write(b"0\r\n\r\n")

            def _send(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def url(self, fault: str) -> str:
        return f"http://127.0.0.1:{self.port}/{fault}/v1"

    def __enter__(self) -> FaultServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
