"""Mutual TLS for the peer plane (daemon-to-daemon gRPC), configured in ``[tls]``.

Every daemon has one certificate and key, used both as the Peer listener's server certificate and as
the client certificate it presents when it links to another daemon, and one CA bundle that the other
side's certificate must chain to. Listeners require a client certificate (a peer without one, or with
one from another CA, fails the TLS handshake before any RPC runs); linking daemons verify the
listener's certificate against the address they dial (an IP address needs an IP SAN) or against
``[tls] server_name`` when certificates carry DNS names only. The HMAC handshake of ``peering`` still
runs inside the TLS session: TLS proves the node, the shared secret proves the deployment.

The files are re-read when they change (size, mtime or inode): the listener asks on every new
connection (``grpc.dynamic_ssl_server_credentials``) and every new link builds its channel from the
current files, so certificates rotate without a restart. A changed set that does not load (a key that
does not match its certificate, a half-written file) is refused with a warning and the last good set
stays in use. Only the control plane is encrypted; the data plane is authenticated by the token
derived from the handshake, its frames are not encrypted (docs/operations.md, "Peer security").
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from dataclasses import dataclass
from typing import Callable

import grpc

__all__ = ["PeerTls", "TlsError", "TlsFiles"]

log = logging.getLogger(__name__)


class TlsError(OSError):
    """A ``[tls]`` file is missing, unreadable or not a matching certificate/key/CA set."""


@dataclass(frozen=True)
class TlsFiles:
    cert_file: str
    key_file: str
    ca_file: str


@dataclass(frozen=True)
class _Pem:
    cert: bytes
    key: bytes
    ca: bytes
    stamp: tuple


def _stamp(files: TlsFiles) -> tuple:
    out = []
    for what, path in (("cert_file", files.cert_file), ("key_file", files.key_file), ("ca_file", files.ca_file)):
        try:
            st = os.stat(path)
        except OSError as exc:
            raise TlsError(f"[tls] {what} {path}: {exc.strerror}") from None
        out.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


def _read(files: TlsFiles) -> _Pem:
    """Read and check the set: PEM, the key matches the certificate, the CA bundle parses."""
    stamp = _stamp(files)
    blobs = []
    for what, path in (("cert_file", files.cert_file), ("key_file", files.key_file), ("ca_file", files.ca_file)):
        try:
            with open(path, "rb") as f:
                blobs.append(f.read())
        except OSError as exc:
            raise TlsError(f"[tls] {what} {path}: {exc.strerror}") from None
    cert, key, ca = blobs
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(files.cert_file, files.key_file)
    except (ssl.SSLError, ValueError) as exc:
        raise TlsError(f"[tls] cert_file {files.cert_file} and key_file {files.key_file} are not a matching "
                       f"PEM certificate and private key: {exc}") from None
    try:
        context.load_verify_locations(cadata=ca.decode("ascii", "replace"))  # the bytes that will be served
    except (ssl.SSLError, ValueError) as exc:
        raise TlsError(f"[tls] ca_file {files.ca_file} is not a PEM CA bundle: {exc}") from None
    return _Pem(cert, key, ca, stamp)


class PeerTls:
    """The node's TLS material for the peer plane, reloaded when its files change."""

    def __init__(self, files: TlsFiles, server_name: str = "") -> None:
        self.files = files
        self.server_name = server_name
        self._lock = threading.Lock()
        self._pem = _read(files)  # fail at start, not at the first link
        self._refused: tuple | None = None

    def current(self) -> _Pem:
        """The last good set, re-read first if a file changed since it was loaded."""
        with self._lock:
            try:
                stamp = _stamp(self.files)
            except TlsError as exc:
                return self._keep(exc, ("unreadable", str(exc)))
            if stamp == self._pem.stamp or stamp == self._refused:
                return self._pem
            try:
                pem = _read(self.files)
            except TlsError as exc:
                return self._keep(exc, stamp)
            log.info("peer TLS certificate files changed: reloaded %s", self.files.cert_file)
            self._pem, self._refused = pem, None
            return pem

    def _keep(self, exc: TlsError, stamp: tuple) -> _Pem:
        if stamp != self._refused:  # once per bad state, not once per connection
            log.warning("peer TLS files changed but do not load (%s); still using the previous set", exc)
        self._refused = stamp
        return self._pem

    # ---- grpc credentials ------------------------------------------------------------------------

    def _server_config(self, pem: _Pem) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration([(pem.key, pem.cert)], root_certificates=pem.ca)

    def certificate_fetcher(self) -> Callable[[], grpc.ServerCertificateConfiguration | None]:
        """For one listener: a new configuration when the files changed since it last served, else None."""
        served = [self._pem.stamp]

        def fetch() -> grpc.ServerCertificateConfiguration | None:
            pem = self.current()
            if pem.stamp == served[0]:
                return None
            served[0] = pem.stamp
            return self._server_config(pem)

        return fetch

    def server_credentials(self) -> grpc.ServerCredentials:
        """Listener credentials: client certificates required; grpc asks the fetcher on every new connection."""
        return grpc.dynamic_ssl_server_credentials(self._server_config(self._pem), self.certificate_fetcher(),
                                                   require_client_authentication=True)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        pem = self.current()
        return grpc.ssl_channel_credentials(root_certificates=pem.ca, private_key=pem.key,
                                            certificate_chain=pem.cert)

    def channel_options(self) -> list[tuple[str, str]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []

    def describe(self) -> str:
        name = f", server name {self.server_name}" if self.server_name else ""
        return f"mutual TLS (cert {self.files.cert_file}, CA {self.files.ca_file}{name})"
