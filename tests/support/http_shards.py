"""A folder served over HTTP on 127.0.0.1 from a thread of the test process, with deterministic faults.

``ShardServer(root)`` serves the files below ``root`` at ``server.url("train/shard-000000.tar")``;
``server.fault(path, kind, times)`` makes the next ``times`` requests of that path fail:
"404" and "503" answer that status, "drop" sends the headers of the whole file (its
Content-Length) and ``at`` bytes of it, then closes the connection. Nothing waits on a clock.
"""

from __future__ import annotations

import http.server
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Fault:
    kind: str  # "404", "503" or "drop"
    times: int  # requests still to fail
    at: int = 0  # "drop": bytes sent before the connection is closed


class ShardServer:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.faults: dict[str, Fault] = {}
        self.requests: Counter = Counter()  # path -> GET requests received
        self.lock = threading.Lock()
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="shard-server", daemon=True)

    def __enter__(self) -> ShardServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()

    @property
    def base(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/"

    def url(self, path: str) -> str:
        return self.base + path

    def fault(self, path: str, kind: str, times: int = 1, at: int = 0) -> None:
        with self.lock:
            self.faults[path] = Fault(kind, times, at)

    def _take_fault(self, path: str) -> Fault | None:
        with self.lock:
            self.requests[path] += 1
            fault = self.faults.get(path)
            if fault is None or fault.times == 0:
                return None
            fault.times -= 1
            return fault

    def _handler(self):
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                path = self.path.lstrip("/").split("?")[0]
                fault = server._take_fault(path)
                file = server.root / path
                if (fault is not None and fault.kind == "404") or not file.is_file():
                    return self._status(404)
                if fault is not None and fault.kind == "503":
                    return self._status(503)
                data = file.read_bytes()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if fault is not None and fault.kind == "drop":
                    self.wfile.write(data[: fault.at])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(data)

            def _status(self, code: int) -> None:
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):  # quiet
                pass

        return Handler
