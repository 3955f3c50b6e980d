"""Embedded S3: moto's server on a free loopback port, for demos and tests.

moto is an optional dependency (the ``local`` extra); importing this module without it
works, starting the server explains how to install it.

Example::

    with EmbeddedS3() as s3:
        store = ResultStore(endpoint_url=s3.endpoint_url)
"""

from __future__ import annotations

import logging
from types import TracebackType
from typing import Any

from agentcore_rl.errors import ConfigurationError

__all__ = ["EmbeddedS3"]


class EmbeddedS3:
    """A real S3 API (moto's threaded server) on ``127.0.0.1`` and a free port.

    The server keeps its state in memory and dies with the process. ``stop()`` is
    idempotent. Its own request log is quiet unless ``verbose`` is set.

    Example::

        s3 = EmbeddedS3().start()
        try:
            print(s3.endpoint_url)   # http://127.0.0.1:<port>
        finally:
            s3.stop()
    """

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, verbose: bool = False):
        self.host = host
        self.port = port
        self.verbose = verbose
        self._server: Any = None

    def __repr__(self) -> str:
        state = "running" if self._server is not None else "stopped"
        return f"EmbeddedS3(host={self.host!r}, port={self.port}, {state})"

    @property
    def endpoint_url(self) -> str:
        """``http://host:port`` of the running server."""
        if self._server is None:
            raise RuntimeError("EmbeddedS3 is not running; call start() first")
        return f"http://{self.host}:{self.port}"

    def start(self) -> EmbeddedS3:
        """Start the server (no-op when running) and return ``self``.

        Example::

            s3 = EmbeddedS3().start()
        """
        if self._server is not None:
            return self
        try:
            from moto.server import ThreadedMotoServer
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ConfigurationError(
                "embedded S3 needs moto: pip install 'agentcore-rl[local]'"
            ) from exc
        if not self.verbose:
            logging.getLogger("werkzeug").setLevel(logging.ERROR)
        server = ThreadedMotoServer(ip_address=self.host, port=self.port, verbose=self.verbose)
        server.start()
        self.port = server.get_host_and_port()[1]
        self._server = server
        return self

    def stop(self) -> None:
        """Stop the server. Idempotent."""
        server, self._server = self._server, None
        if server is not None:
            server.stop()

    def __enter__(self) -> EmbeddedS3:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
