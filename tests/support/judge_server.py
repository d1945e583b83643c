"""A scripted OpenAI-compatible chat server for the LLM-judge tests: a real HTTP server
on 127.0.0.1 in a thread, whose answers come from a Python function of the request."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# (status, body, delay_s): what the server sends for one request, after delay_s seconds.
Answer = tuple[int, bytes, float]


def chat_body(text: str, prompt_tokens: int = 100, completion_tokens: int = 20) -> bytes:
    """A chat/completions response carrying ``text`` and a usage block."""
    return json.dumps(
        {
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens},
        }
    ).encode()


def verdict(text: str, delay_s: float = 0.0) -> Answer:
    return 200, chat_body(text), delay_s


class ScriptedJudgeServer:
    """``answer(request_json) -> Answer`` decides each reply; ``requests`` records every
    request (JSON body and headers). Use as a context manager; ``base_url`` ends in /v1."""

    def __init__(self, answer: Callable[[dict[str, Any]], Answer]):
        self.answer = answer
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                req = json.loads(self.rfile.read(n))
                server.requests.append(req)
                server.headers.append(dict(self.headers))
                if self.path != "/v1/chat/completions":
                    status, body, delay = 404, b"not found", 0.0
                else:
                    status, body, delay = server.answer(req)
                time.sleep(delay)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out and left

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> ScriptedJudgeServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def sequence(*answers: Answer) -> Callable[[dict[str, Any]], Answer]:
    """Answers in order, one per request (the last one repeats)."""
    it = list(answers)

    def answer(_: dict[str, Any]) -> Answer:
        return it.pop(0) if len(it) > 1 else it[0]

    return answer


def user_text(req: dict[str, Any]) -> str:
    return req["messages"][-1]["content"]
