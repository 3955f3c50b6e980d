"""Embedded S3: moto's S3 app on uvicorn on a free loopback port, for demos and tests.
moto and a2wsgi (the ``local`` extra) are imported when the server starts."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import Any

from agentcore_rl.errors import ConfigurationError
from agentcore_rl.local.background import BackgroundServer

__all__ = ["EmbeddedS3"]

_log = logging.getLogger(__name__)

# moto's handlers hold the GIL, so more threads add only switching; a few let requests
# waiting on the loop overlap with one that computes (the rest queue, none is refused).
_WORKERS = 8
# Well above aiobotocore's 12 s pool keep-alive: the client always retires an idle
# connection first, so none is reused just as the server closes it.
_KEEP_ALIVE = 60
_SHUTDOWN_TIMEOUT = 10.0

_WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def _with_werkzeug_environ(app: _WSGIApp) -> _WSGIApp:
    """Give moto's app the environ werkzeug (moto's own server) builds where a2wsgi's differs:
    the undecoded target (``RAW_URI``), chunked bodies, headers with underscores."""
    # lazy: moto is the local extra, loaded when the server starts
    from moto.core.request import (
        PRESERVED_HEADER_NAMES_ENVIRON_KEY,
        environ_key_for_header,
        should_preserve_original_header_name,
    )

    def wrapped(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        scope = environ["asgi.scope"]
        target = scope.get("raw_path") or scope["path"].encode()
        if scope["query_string"]:
            target += b"?" + scope["query_string"]
        environ["RAW_URI"] = environ["REQUEST_URI"] = target.decode("latin-1")
        if "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower():
            environ["wsgi.input_terminated"] = True  # read the body to its end, no length
        headers = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in scope["headers"]]
        names: dict[str, str] = {}
        if any("_" in name for name, _ in headers):
            # WSGI folds "-" and "_" into one key; werkzeug drops underscored names (no
            # spoofing) and moto puts back S3 metadata keys unless a dashed header has the key.
            dashed: dict[str, list[str]] = {}
            kept: dict[str, list[str]] = {}
            for name, value in headers:
                if "_" not in name:
                    dashed.setdefault(environ_key_for_header(name), []).append(value)
            for name, value in headers:
                if "_" not in name:
                    continue
                key = environ_key_for_header(name)
                if key in dashed:
                    environ[key] = ",".join(dashed[key])
                    continue
                environ.pop(key, None)
                if should_preserve_original_header_name(name):
                    names.setdefault(key, name)
                    kept.setdefault(key, []).append(value)
            for key, values in kept.items():
                environ[key] = ",".join(values)
        environ[PRESERVED_HEADER_NAMES_ENVIRON_KEY] = names
        return app(environ, start_response)

    return wrapped


def moto_wsgi_app() -> Any:
    """What moto's ThreadedMotoServer serves, as a WSGI app (Any: a2wsgi's environ type is
    too narrow)."""
    try:  # lazy: moto is the local extra
        from moto import backends
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigurationError(
            "embedded S3 needs moto and a2wsgi: pip install 'agentcore-rl[local]'"
        ) from exc
    # moto lists its own package directory on every request to route it (half its CPU per
    # request); the list cannot change while it runs.
    modules = tuple(backends.list_of_moto_modules())
    backends.list_of_moto_modules = lambda: modules
    return _with_werkzeug_environ(DomainDispatcherApplication(create_backend_app))


class EmbeddedS3:
    """A real S3 API (moto's) on ``127.0.0.1`` and a free port, with HTTP/1.1 keep-alive.

    moto's own werkzeug server closes every connection, which real S3 does not, so its WSGI
    app is served by uvicorn (through a2wsgi) in a daemon thread with its own event loop:
    it works from synchronous code and from any event loop. State is in memory; ``stop()``
    is idempotent; the request log is quiet.

    Example::

        s3 = EmbeddedS3().start()
        try:
            print(s3.endpoint_url)   # http://127.0.0.1:<port>
        finally:
            s3.stop()
    """

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0):
        self.host = host
        self.port = port
        self._stop: Callable[[], object] | None = None  # tells the server's thread to stop
        self._thread: threading.Thread | None = None
        self._executor: ThreadPoolExecutor | None = None

    @property
    def endpoint_url(self) -> str:
        """``http://host:port`` of the running server."""
        if self._stop is None:
            raise RuntimeError("EmbeddedS3 is not running; call start() first")
        return f"http://{self.host}:{self.port}"

    def start(self) -> EmbeddedS3:
        """Start the server (no-op when running) and return ``self``."""
        if self._stop is not None:
            return self
        try:  # lazy: a2wsgi and moto are the local extra
            from a2wsgi import WSGIMiddleware
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ConfigurationError(
                "embedded S3 needs moto and a2wsgi: pip install 'agentcore-rl[local]'"
            ) from exc
        moto_app = moto_wsgi_app()
        wsgi = WSGIMiddleware(moto_app, workers=_WORKERS)
        server = BackgroundServer(
            wsgi,
            host=self.host,
            port=self.port,
            shutdown_timeout=_SHUTDOWN_TIMEOUT,
            access_log=False,
            lifespan="off",
            timeout_keep_alive=_KEEP_ALIVE,
            backlog=4096,
            server_header=False,  # moto names its own server, as werkzeug lets it
        )
        # How to stop it, or why it did not start.
        ready: Future[Callable[[], object]] = Future()

        async def serve() -> None:
            stop = asyncio.Event()
            try:
                await server.start()
            except BaseException as exc:
                ready.set_exception(exc)
                return
            loop = asyncio.get_running_loop()
            ready.set_result(lambda: loop.call_soon_threadsafe(stop.set))
            try:
                await stop.wait()
            finally:
                await server.aclose()

        thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
        thread.start()
        self._thread, self._executor = thread, wsgi.executor
        try:
            self._stop, self.port = ready.result(), server.port
        except BaseException:
            self.stop()
            raise
        thread.name = f"EmbeddedS3 :{self.port}"
        return self

    def stop(self) -> None:
        """Stop the server, waiting a bounded time for requests in flight. Idempotent."""
        stop, self._stop = self._stop, None
        thread, self._thread = self._thread, None
        executor, self._executor = self._executor, None
        if thread is None or executor is None:
            return
        if stop is not None:
            stop()  # a graceful shutdown, forced after _SHUTDOWN_TIMEOUT
        thread.join(2 * _SHUTDOWN_TIMEOUT)
        if thread.is_alive():  # pragma: no cover - a request stuck in moto
            _log.warning("embedded S3 on port %s did not stop in time", self.port)
        # a2wsgi never closes its thread pool; idle workers end now, not at exit.
        executor.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> EmbeddedS3:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
