"""Test helper: a real tool server in a subprocess on a free loopback port.

    with run_server(tools=["python_code", "sql"], timeout=5) as url:
        requests.post(url + "/get_observation", json={...})

Keyword arguments become command-line flags (``max_obs_length=100`` ->
``--max-obs-length 100``; ``True`` -> a bare flag; lists repeat the flag; a dict
``tool_opt={"k": "v"}`` -> ``--tool-opt k=v``).
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Iterator, Optional, Sequence

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def server_argv(tools: Sequence[str], **flags) -> list[str]:
    """The command line that :func:`run_server` starts."""
    argv = [sys.executable, "-m", "tool_server", "--tools", ",".join(tools),
            "--host", "127.0.0.1", "--port", str(flags.pop("port", 0))]
    for key, value in flags.items():
        flag = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            argv.append(flag)
        elif isinstance(value, dict):
            for k, v in value.items():
                argv += [flag, f"{k}={v}"]
        elif isinstance(value, (list, tuple)):
            for v in value:
                argv += [flag, str(v)]
        else:
            argv += [flag, str(value)]
    return argv


def get_json(url: str, timeout: float = 10.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def post_json(url: str, body: object, timeout: float = 60.0) -> tuple[int, dict]:
    """POST ``body`` (an object, or raw ``bytes``) -> ``(status, decoded JSON)``."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


@contextlib.contextmanager
def run_server(tools: Sequence[str] = ("python_code",), *, startup_timeout: float = 60.0,
               env: Optional[dict] = None, **flags) -> Iterator[str]:
    """Start ``python -m tool_server`` on a free port, wait for ``/health``, yield the
    base URL (``http://127.0.0.1:PORT``), then stop it (SIGTERM, then SIGKILL)."""
    argv = server_argv(tools, **flags)
    proc_env = dict(os.environ)
    proc_env["PYTHONPATH"] = _REPO_ROOT + os.pathsep + proc_env.get("PYTHONPATH", "")
    if env:
        proc_env.update(env)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=_REPO_ROOT, env=proc_env)
    stderr_lines: list[str] = []
    threading.Thread(target=lambda: stderr_lines.extend(proc.stderr), daemon=True).start()
    url_box: list[str] = []

    def read_stdout() -> None:
        for line in proc.stdout:
            if line.startswith("TOOL_SERVER_READY ") and not url_box:
                url_box.append(line.split()[1])
    threading.Thread(target=read_stdout, daemon=True).start()
    try:
        deadline = time.monotonic() + startup_timeout
        while not url_box:
            if proc.poll() is not None or time.monotonic() > deadline:
                time.sleep(0.2)
                raise RuntimeError(f"tool server did not start ({' '.join(argv)}), exit "
                                   f"{proc.poll()}:\n{''.join(stderr_lines)[-4000:]}")
            time.sleep(0.02)
        url = url_box[0]
        get_json(url + "/health")
        yield url
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
