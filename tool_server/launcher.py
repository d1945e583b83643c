"""A real tool server in a subprocess on a loopback port: for tests and for the trainer
(which starts one when ``tool_server.url`` is empty, and restarts it if it dies).

    with run_server(tools=["python_code", "sql"], timeout=5) as url:
        requests.post(url + "/get_observation", json={...})

:class:`ToolServerProcess` is the same server as an object that can be restarted.

Keyword arguments become command-line flags (``max_obs_length=100`` ->
``--max-obs-length 100``; ``True`` -> a bare flag; lists repeat the flag; a dict
``tool_opt={"k": "v"}`` -> ``--tool-opt k=v``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def server_argv(tools: Sequence[str], **flags) -> list[str]:
    """The command line that :func:`run_server` starts."""
    argv = [
        sys.executable,
        "-m",
        "tool_server",
        "--tools",
        ",".join(tools),
        "--host",
        "127.0.0.1",
        "--port",
        str(flags.pop("port", 0)),
    ]
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


class ToolServerProcess:
    """A tool server subprocess that we own: :meth:`start`, :meth:`restart` (after it
    died: on the same port when it is free, so clients keep their URL), :meth:`stop`.

    Unless ``workdir`` is among the flags, the server's scratch root is a fresh temporary
    directory that this object removes when the server stops or is restarted, so a
    server killed with SIGKILL leaves no files behind.
    """

    def __init__(
        self,
        tools: Sequence[str] = ("python_code",),
        *,
        startup_timeout: float = 60.0,
        env: dict | None = None,
        **flags,
    ) -> None:
        self.tools = list(tools)
        self.startup_timeout = startup_timeout
        self.env = env
        self.flags = dict(flags)
        self.url: str | None = None
        self.restarts = 0
        self.proc: subprocess.Popen | None = None
        self.scratch: str | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, port: int | None = None) -> str:
        """Start the server (on ``port``, else the ``port`` flag, else a free one);
        return its base URL once ``/health`` answers."""
        flags = dict(self.flags)
        if port is not None:
            flags["port"] = port
        if "workdir" not in flags:
            self.scratch = tempfile.mkdtemp(prefix="verltool_tools_")
            flags["workdir"] = self.scratch
        argv = server_argv(self.tools, **flags)
        proc_env = dict(os.environ)
        proc_env["PYTHONPATH"] = _REPO_ROOT + os.pathsep + proc_env.get("PYTHONPATH", "")
        if self.env:
            proc_env.update(self.env)
        self.proc = proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=_REPO_ROOT,
            env=proc_env,
        )
        out, err = proc.stdout, proc.stderr
        assert out is not None and err is not None  # both are PIPEs
        stderr_lines: list[str] = []
        threading.Thread(target=lambda: stderr_lines.extend(err), daemon=True).start()
        url_box: list[str] = []

        def read_stdout() -> None:
            for line in out:
                if line.startswith("TOOL_SERVER_READY ") and not url_box:
                    url_box.append(line.split()[1])

        threading.Thread(target=read_stdout, daemon=True).start()
        try:
            deadline = time.monotonic() + self.startup_timeout
            while not url_box:
                if proc.poll() is not None or time.monotonic() > deadline:
                    time.sleep(0.2)
                    raise RuntimeError(
                        f"tool server did not start ({' '.join(argv)}), exit "
                        f"{proc.poll()}:\n{''.join(stderr_lines)[-4000:]}"
                    )
                time.sleep(0.02)
            # it listens before it prints READY, yet a probe can still be refused (seen
            # once on CI when restarting on a just-freed port): retry until the deadline
            while True:
                try:
                    get_json(url_box[0] + "/health")
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        except BaseException:
            self.stop()
            raise
        self.url = url_box[0]
        return self.url

    def restart(self) -> str:
        """Stop what is left of the server and start a new one, on the same port if it
        can be bound again (else on a free one); return the (possibly new) URL."""
        port = int(self.url.rsplit(":", 1)[1]) if self.url else None
        self.stop()
        self.restarts += 1
        try:
            return self.start(port=port)
        except RuntimeError:
            if port is None:
                raise
            return self.start(port=0)  # the old port was taken meanwhile

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s; remove the scratch directory."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None

    def __enter__(self) -> ToolServerProcess:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


@contextlib.contextmanager
def run_server(
    tools: Sequence[str] = ("python_code",),
    *,
    startup_timeout: float = 60.0,
    env: dict | None = None,
    **flags,
) -> Iterator[str]:
    """Start ``python -m tool_server`` on a free port, wait for ``/health``, yield the
    base URL (``http://127.0.0.1:PORT``), then stop it (SIGTERM, then SIGKILL) and remove
    its scratch directory (see :class:`ToolServerProcess`)."""
    with ToolServerProcess(tools, startup_timeout=startup_timeout, env=env, **flags) as server:
        assert server.url is not None  # entering the context started the server
        yield server.url


class ToolServerSettings(Protocol):
    """What :func:`serve_tools` reads: the run config's ``tool_server`` section."""

    @property
    def url(self) -> str: ...
    @property
    def tools(self) -> Sequence[str]: ...
    @property
    def timeout_s(self) -> float: ...
    @property
    def max_concurrency(self) -> int: ...
    @property
    def tool_opt(self) -> Mapping[str, object]: ...


@contextlib.contextmanager
def serve_tools(
    ts: ToolServerSettings, out: str | os.PathLike | None = None
) -> Iterator[tuple[str, ToolServerProcess | None]]:
    """``(url, process)``: ``ts.url`` with no process if set, else a server we launch (a
    :class:`ToolServerProcess`, which can be restarted) with ``ts.tools`` and the
    ``ts.tool_opt`` options (empty values left out), stopped and its scratch directory
    removed on exit. The scratch directory is temporary, so a web search cache not
    configured otherwise lives in the run directory ``out`` (paid results survive
    restarts and resumes). A tool the server cannot load stops the start
    (:func:`refuse_unavailable_tools`)."""
    if ts.url:
        yield ts.url, None
        return
    tool_opt = {k: v for k, v in ts.tool_opt.items() if v not in (None, "")}
    if (
        out is not None
        and "web_search" in ts.tools
        and "web_search_cache" not in tool_opt
        and not os.environ.get("VERLTOOL_WEB_SEARCH_CACHE")
    ):
        tool_opt["web_search_cache"] = str(Path(out).resolve() / "web_search_cache.sqlite")
    with ToolServerProcess(
        list(ts.tools), timeout=ts.timeout_s, max_concurrency=ts.max_concurrency, tool_opt=tool_opt
    ) as proc:
        assert proc.url is not None  # entering the context started the server
        log.info("tool server with %s at %s", ",".join(ts.tools), proc.url)
        refuse_unavailable_tools(get_json(proc.url + "/health"))
        yield proc.url, proc


def refuse_unavailable_tools(health: dict) -> None:
    """A run needs every tool it names: the server serves the others when a plugin tool
    cannot be loaded (``unavailable_tools`` in its ``/health``), the run does not start."""
    bad = health.get("unavailable_tools") or {}
    if bad:
        raise ValueError(
            f"the tool server cannot serve {sorted(bad)} of tool_server.tools: "
            + "; ".join(bad.values())
        )
