"""``python -m tool_server --tools python_code,sql --host 127.0.0.1 --port 5000``.

Prints ``TOOL_SERVER_READY http://HOST:PORT`` on stdout once it listens (``--port 0``
picks a free port; :func:`tool_server.launcher.run_server` reads that line).
``python -m tool_server --list-tools [--tool-dir DIR]`` prints every tool it could serve
and where each comes from (built in, a --tool-dir, or an installed package).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal

from tool_server.kit.base import ToolSettings
from tool_server.kit.compat import COMPAT_MODES

log = logging.getLogger("tool_server")


def build_parser() -> argparse.ArgumentParser:
    d = ToolSettings()
    p = argparse.ArgumentParser(
        prog="python -m tool_server",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--tools",
        help="comma-separated tool names, in routing order (e.g. python_code,sql)",
    )
    p.add_argument(
        "--list-tools",
        action="store_true",
        help="print every available tool and its source (built-in, --tool-dir or the "
        "installed package), then exit",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=5000, help="0 picks a free port")
    p.add_argument(
        "--workers",
        type=int,
        default=d.workers,
        help="sandboxed python worker processes (default %(default)s)",
    )
    p.add_argument(
        "--max-concurrency",
        type=int,
        default=d.max_concurrency,
        help="tool calls in flight, all tools together (default %(default)s)",
    )
    p.add_argument(
        "--tool-max-concurrency",
        type=int,
        default=d.tool_max_concurrency,
        help="default per-tool bound (default %(default)s)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=d.timeout_s,
        help="per-call wall-clock limit in seconds (default %(default)s)",
    )
    p.add_argument(
        "--max-obs-length",
        type=int,
        default=d.max_obs_chars,
        help="observations longer than this many characters are truncated",
    )
    p.add_argument(
        "--state-ttl",
        type=float,
        default=d.state_ttl_s,
        help="idle per-trajectory state is freed after this many seconds",
    )
    p.add_argument("--sweep-interval", type=float, default=d.sweep_interval_s)
    p.add_argument("--workdir", default=d.workdir, help="scratch root for sandboxes")
    p.add_argument(
        "--max-request-mb",
        type=float,
        default=d.max_request_mb,
        help="larger request bodies are refused with HTTP 413 (default %(default)s)",
    )
    p.add_argument(
        "--max-batch",
        type=int,
        default=d.max_batch,
        help="requests with more actions are refused with HTTP 422 (default %(default)s)",
    )
    p.add_argument(
        "--client-timeout",
        type=float,
        default=d.client_timeout_s,
        help="seconds a client may take to send a request, and to stay idle on a "
        "connection (default %(default)s)",
    )
    p.add_argument(
        "--tool-dir",
        action="append",
        default=[],
        help="extra folder scanned for tool files (repeatable)",
    )
    p.add_argument(
        "--tool-opt",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="tool-specific option (repeatable), e.g. python_stateful=true",
    )
    p.add_argument(
        "--compat",
        choices=COMPAT_MODES,
        default=d.compat,
        help="answer format: native (default) or verltool (observations, dones "
        "and valids as VerlTool's server gives them; see tool_server.kit.compat)",
    )
    p.add_argument(
        "--unsafe-no-sandbox",
        action="store_true",
        help="run code WITHOUT bubblewrap (dangerous; for machines without it)",
    )
    p.add_argument("--no-uvloop", action="store_true", help="use the default asyncio loop")
    p.add_argument("--log-level", default=os.environ.get("TOOL_SERVER_LOG", "WARNING"))
    return p


def _positive(name: str, value: float) -> None:
    if value <= 0:
        raise SystemExit(f"error: {name} must be positive, got {value}")


def settings_from_args(args: argparse.Namespace) -> ToolSettings:
    """Turn parsed flags into :class:`ToolSettings` (exits with a message on bad values)."""
    for name in (
        "workers",
        "max_concurrency",
        "tool_max_concurrency",
        "timeout",
        "max_obs_length",
        "state_ttl",
        "sweep_interval",
        "max_request_mb",
        "max_batch",
        "client_timeout",
    ):
        _positive("--" + name.replace("_", "-"), getattr(args, name))
    extra = {}
    for kv in args.tool_opt:
        if "=" not in kv:
            raise SystemExit(f"error: --tool-opt expects KEY=VALUE, got {kv!r}")
        k, v = kv.split("=", 1)
        extra[k.strip()] = v.strip()
    return ToolSettings(
        timeout_s=args.timeout,
        max_obs_chars=args.max_obs_length,
        state_ttl_s=args.state_ttl,
        unsafe_no_sandbox=args.unsafe_no_sandbox,
        workdir=args.workdir,
        extra=extra,
        workers=args.workers,
        max_concurrency=args.max_concurrency,
        tool_max_concurrency=args.tool_max_concurrency,
        sweep_interval_s=args.sweep_interval,
        tool_dirs=list(args.tool_dir),
        compat=args.compat,
        max_request_mb=args.max_request_mb,
        max_batch=args.max_batch,
        client_timeout_s=args.client_timeout,
    )


async def serve(tools: list[str], settings: ToolSettings, host: str, port: int) -> None:
    from aiohttp import web

    from tool_server.app import create_app

    app = create_app(tools, settings)
    # handler_cancellation: a client that disconnects cancels its request's tool calls;
    # keepalive_timeout: a connection idle (or stuck in its headers) that long is closed
    runner = web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        handler_cancellation=True,
        keepalive_timeout=settings.client_timeout_s,
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024, reuse_address=True)
    await site.start()
    bound = site._server.sockets[0].getsockname()  # the real port when --port 0
    print(f"TOOL_SERVER_READY http://{host}:{bound[1]}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def print_tool_list(tool_dirs: list[str]) -> None:
    """The ``--list-tools`` table: name, source, usage (or the problem of a tool that
    cannot be used, marked ``UNUSABLE``)."""
    from tool_server.registry import list_tools

    rows = list_tools(tool_dirs)
    width = max([len(r.name) for r in rows] + [4])
    src = max([len(r.source) for r in rows] + [6])
    print(f"{'tool':<{width}}  {'source':<{src}}  usage")
    for r in rows:
        usage = r.usage.replace("\n", " ") if r.ok else f"UNUSABLE: {r.usage}"
        print(f"{r.name:<{width}}  {r.source:<{src}}  {usage}")


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.list_tools:
        try:
            print_tool_list(args.tool_dir)
        except FileNotFoundError as e:  # a missing --tool-dir
            raise SystemExit(f"error: {e}") from None
        return
    if not args.tools:
        raise SystemExit("error: --tools is required (or --list-tools to see the choices)")
    settings = settings_from_args(args)
    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    if not tools:
        raise SystemExit("error: --tools needs at least one tool name")
    if settings.unsafe_no_sandbox:
        log.warning(
            "!" * 72 + "\n--unsafe-no-sandbox: model-written code runs WITHOUT a "
            "sandbox, with this server's privileges. Never use this on a machine "
            "you care about.\n" + "!" * 72
        )
    if not args.no_uvloop:
        try:
            import uvloop

            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        except ImportError:
            pass
    try:
        asyncio.run(serve(tools, settings, args.host, args.port))
    except KeyError as e:  # unknown tool names
        raise SystemExit(f"error: {e.args[0]}") from None
    except (ValueError, FileNotFoundError) as e:
        # bad --tool-opt value, missing --tool-dir, a requested plugin that cannot be used
        raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
    main()
