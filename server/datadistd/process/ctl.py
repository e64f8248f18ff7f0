"""``datadistctl``: what the local datadistd is doing — status, links, caches — and peer reachability.

It calls the daemon's diagnostics RPCs (``GetStatus``, ``ListLinks``, ``ListCaches``) over the
worker socket, the same ones grpcurl shows; ``ping`` runs the standard gRPC health check against
a peer daemon's listen address. Tables by default; ``--json`` prints the response in the protobuf
JSON mapping (field names as in ``proto/datadist/v1/datadist.proto``, 64-bit integers as strings,
enums by name) for scripts.

Exit codes: 0 ok, 1 the daemon (or peer) cannot be reached or the call failed, 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
import time
from typing import Any, Callable, Mapping, Sequence

import grpc
from google.protobuf.json_format import MessageToDict
from grpc_health.v1 import health_pb2, health_pb2_grpc

from datadist.address import socket_path
from datadist.status import STATUS_METADATA_KEY, LLMStatusCode
from datadist.v1 import common_pb2, datadist_pb2, datadist_pb2_grpc

from .. import __version__
from ..api.grpc.tls import PeerTls, TlsError, TlsFiles
from ..ops.config import ConfigError, default_socket_path, load_config

__all__ = ["main", "resolve_socket", "CtlError"]

DAEMON_ENV = "DATADIST_DAEMON"
SYSTEM_SOCKET = "/run/datadist/datadistd.sock"
CHANNEL_OPTIONS = [("grpc.enable_http_proxy", 0)]


class CtlError(Exception):
    """A one-line, user-facing failure (exit code 1)."""


# ---- finding the daemon ----------------------------------------------------------------------------

def _strip_scheme(value: str) -> str:
    try:
        return socket_path(value)   # the parser workers use too
    except ValueError as exc:
        raise CtlError(str(exc)) from None


def resolve_socket(socket_arg: str | None, config_path: str | None = None,
                   env: Mapping[str, str] | None = None) -> str:
    """``--socket``, else ``$DATADIST_DAEMON``, else ``[daemon] socket`` of ``--config``, else the
    system socket if it exists, else the daemon's own default for this user."""
    env = os.environ if env is None else env
    if socket_arg:
        return _strip_scheme(socket_arg)
    if env.get(DAEMON_ENV):
        return _strip_scheme(env[DAEMON_ENV])
    if config_path:
        try:
            return load_config(config_path, env={}).daemon.socket
        except ConfigError as exc:
            raise CtlError(str(exc)) from None
    if os.path.exists(SYSTEM_SOCKET):
        return SYSTEM_SOCKET
    return default_socket_path()


def _check_socket(path: str) -> None:
    hint = "is datadistd running? choose it with --socket or DATADIST_DAEMON"
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise CtlError(f"no daemon socket at {path} ({hint})") from None
    except PermissionError:
        raise CtlError(f"permission denied on {path} (join the datadist group)") from None
    if not stat.S_ISSOCK(st.st_mode):
        raise CtlError(f"{path} is not a socket ({hint})")
    if not os.access(path, os.R_OK | os.W_OK):
        raise CtlError(f"permission denied on {path} (join the datadist group)")


def _rpc_error(err: grpc.RpcError, where: str, timeout: float) -> CtlError:
    code = err.code()
    details = err.details() or ""
    for key, value in err.trailing_metadata() or ():
        if key == STATUS_METADATA_KEY:
            try:
                name = LLMStatusCode(int(value)).name
            except ValueError:
                name = f"status {value}"
            return CtlError(f"{name}: {details}")
    if code == grpc.StatusCode.UNAVAILABLE:
        return CtlError(f"cannot reach {where}: {details} (is it running?)")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return CtlError(f"{where} did not answer within {timeout:g}s")
    return CtlError(f"{where}: {code.name}: {details}")


def _admin_or_worker(socket_path: str) -> str:
    """The admin socket beside ``socket_path`` (every engine) when this user may use it, else the worker socket.

    The admin socket is mode 0600: root and the daemon's user. Anyone else in the datadist group sees the
    daemon itself but no engine (engines are private to the worker that created them)."""
    admin = socket_path + ".admin"
    if os.path.exists(admin) and os.access(admin, os.R_OK | os.W_OK):
        return admin
    if os.path.exists(admin):
        print(f"datadistctl: {admin} needs root or the daemon's user (e.g. sudo -u datadist datadistctl ...); "
              "showing the daemon without its engines", file=sys.stderr)
    return socket_path


def _call(socket_path: str, method: str, request: Any, timeout: float) -> Any:
    _check_socket(socket_path)
    socket_path = _admin_or_worker(socket_path)
    where = f"datadistd at {socket_path}"
    with grpc.insecure_channel(f"unix:{os.path.abspath(socket_path)}", options=CHANNEL_OPTIONS) as channel:
        stub = datadist_pb2_grpc.DataDistStub(channel)
        try:
            return getattr(stub, method)(request, timeout=timeout)
        except grpc.RpcError as err:
            raise _rpc_error(err, where, timeout) from None


# ---- rendering -------------------------------------------------------------------------------------

def to_json(message: Any) -> dict[str, Any]:
    return MessageToDict(message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(c) for c in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells)


def human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def human_duration(seconds: float) -> str:
    s = int(seconds)
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if days:
        return f"{days}d{hours}h{minutes:02d}m"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{s:02d}s"
    return f"{seconds:.1f}s"


def _enum_name(enum: Any, value: int, prefix: str) -> str:
    try:
        return enum.Name(value).removeprefix(prefix)
    except ValueError:
        return str(value)


def _role(value: int) -> str:
    return _enum_name(common_pb2.Role, value, "ROLE_")


def _placement(value: int) -> str:
    return _enum_name(common_pb2.Placement, value, "PLACEMENT_")


def _dtype(value: int) -> str:
    from ..core.types import DType

    try:
        return DType(value).name.removeprefix("DT_").lower()
    except ValueError:
        return str(value)


def _key(key: common_pb2.AnyKey) -> str:
    kind = key.WhichOneof("key")
    if kind == "blocks_key":
        return f"blocks(cluster={key.blocks_key.cluster_id},model={key.blocks_key.model_id})"
    if kind == "by_id":
        k = key.by_id
        return f"id(cluster={k.cluster_id},cache={k.cache_id},batch={k.batch_index})"
    if kind == "cache_key":
        k = key.cache_key
        ident = f"req={k.req_id}" if k.req_id != 2**64 - 1 else f"prefix={k.prefix_id}"
        return f"key(cluster={k.cluster_id},{ident},model={k.model_id})"
    return "-"


def render_status(status: datadist_pb2.DaemonStatus) -> str:
    head = (f"datadistd {status.version} on {status.socket or '?'}: backend {status.backend}, transport "
            f"{status.transport}, peers {status.peer_security or '?'}, up {human_duration(status.uptime_seconds)}, "
            f"{len(status.engines)} engine(s)")
    if not status.engines:
        return head + "\n(no engines: no worker has called LLMDataDist.init on this daemon)"
    rows = []
    for e in status.engines:
        pools = ", ".join(f"{_placement(p.placement)} {human_bytes(p.used)}/{human_bytes(p.capacity)}"
                          + (f" ({100 * p.used / p.capacity:.0f}%)" if p.capacity else "") for p in e.pools)
        rows.append([e.engine_id, e.cluster_id, _role(e.role), e.pid or "-", e.listen_address or "-", e.caches,
                     e.links, pools or "-"])
    return head + "\n\n" + table(["ENGINE", "CLUSTER", "ROLE", "PID", "LISTEN", "CACHES", "LINKS", "POOLS"], rows)


def render_links(links: datadist_pb2.LinkList) -> str:
    if not links.links:
        return "(no links)"
    rows = [[li.engine_id, li.local_cluster_id, li.remote_cluster_id, li.state, li.transport,
             "initiator" if li.initiator else "serving", li.peer_address or "-", li.data_endpoint or "-",
             li.streams, human_bytes(li.bytes_in), human_bytes(li.bytes_out)] for li in links.links]
    return table(["ENGINE", "CLUSTER", "PEER", "STATE", "TRANSPORT", "SIDE", "PEER ADDRESS", "DATA ENDPOINT",
                  "STREAMS", "IN", "OUT"], rows)


def render_caches(caches: datadist_pb2.CacheList) -> str:
    rows = []
    for group in caches.engines:
        for c in group.caches:
            keys = [_key(k) for k in c.keys]
            shown = ", ".join(keys[:3]) + (f" (+{len(keys) - 3})" if len(keys) > 3 else "")
            rows.append([group.engine_id, group.cluster_id, c.cache_id, "blocks" if c.is_blocks else "cache",
                         _placement(c.desc.placement), c.desc.num_tensors, "x".join(str(d) for d in c.desc.shape),
                         _dtype(c.desc.data_type), "registered" if c.registered else "allocated",
                         "yes" if c.remote_accessible else "no", shown or "-"])
    if not rows:
        return "(no caches)"
    return table(["ENGINE", "CLUSTER", "CACHE", "KIND", "PLACEMENT", "TENSORS", "SHAPE", "DTYPE", "MEMORY",
                  "REMOTE", "KEYS"], rows)


# ---- commands --------------------------------------------------------------------------------------

def _diagnostic(method: str, render: Callable[[Any], str]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        socket_path = resolve_socket(args.socket, args.config)
        reply = _call(socket_path, method, datadist_pb2.StatusRequest(engine_id=args.engine), args.timeout)
        print(json.dumps(to_json(reply), indent=2) if args.json else render(reply))
        return 0

    return run


def _peer_tls(args: argparse.Namespace) -> PeerTls | None:
    """``--tls-*`` flags, else ``[tls]`` of ``--config`` / ``DATADISTD_TLS_*`` when enabled, else plaintext."""
    flags = (args.tls_cert, args.tls_key, args.tls_ca)
    if any(flags):
        if not all(flags):
            raise CtlError("--tls-cert, --tls-key and --tls-ca go together (peers require a client certificate)")
        files, name = TlsFiles(*flags), args.tls_server_name or ""
    else:
        try:
            tls = load_config(args.config).tls
        except ConfigError as exc:
            raise CtlError(str(exc)) from None
        if not tls.enabled:
            return None
        files, name = TlsFiles(tls.cert_file, tls.key_file, tls.ca_file), args.tls_server_name or tls.server_name
    try:
        return PeerTls(files, name)
    except TlsError as exc:
        raise CtlError(str(exc)) from None


def _peer_channel(peer: str, tls: PeerTls | None) -> grpc.Channel:
    if tls is None:
        return grpc.insecure_channel(peer, options=CHANNEL_OPTIONS)
    return grpc.secure_channel(peer, tls.channel_credentials(), options=[*CHANNEL_OPTIONS, *tls.channel_options()])


def ping(args: argparse.Namespace) -> int:
    peer = args.peer
    if ":" not in peer or not peer.rsplit(":", 1)[1].isdigit():
        raise CtlError(f"PEER must be host:port of a peer daemon's listen address, got {peer!r}")
    if args.count < 1:
        raise CtlError("--count must be >= 1")
    tls = _peer_tls(args)
    where = f"peer {peer}" + (" over mutual TLS" if tls is not None else "")
    request = health_pb2.HealthCheckRequest(service=args.service)
    with _peer_channel(peer, tls) as channel:
        stub = health_pb2_grpc.HealthStub(channel)

        def check() -> tuple[str, float]:
            t0 = time.monotonic()
            try:
                reply = stub.Check(request, timeout=args.timeout)  # fails fast when nothing listens
            except grpc.RpcError as err:
                raise _rpc_error(err, where, args.timeout) from None
            return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status), (time.monotonic() - t0) * 1e3

        status, connect_ms = check()  # the first check includes opening the connection
        rtts: list[float] = []
        for _ in range(args.count):
            status, rtt = check()
            rtts.append(rtt)
    result = {"peer": peer, "service": args.service, "tls": tls is not None, "status": status,
              "connect_ms": round(connect_ms, 3),
              "rtt_ms": [round(r, 3) for r in rtts], "min_ms": round(min(rtts), 3),
              "avg_ms": round(sum(rtts) / len(rtts), 3), "max_ms": round(max(rtts), 3)}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        secured = " (mutual TLS)" if tls is not None else ""
        print(f"{peer} {status}{secured}: connect {connect_ms:.2f} ms, health check min/avg/max "
              f"{result['min_ms']:.2f}/{result['avg_ms']:.2f}/{result['max_ms']:.2f} ms over {len(rtts)}")
    return 0 if status == "SERVING" else 1


# ---- entry point -------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    # Options accepted before or after the subcommand; SUPPRESS keeps a subcommand from resetting them.
    def common(parser: argparse.ArgumentParser, top: bool) -> None:
        default = (lambda v: v) if top else (lambda v: argparse.SUPPRESS)
        parser.add_argument("--socket", "-s", default=default(None), metavar="PATH",
                            help=f"daemon socket (default: ${DAEMON_ENV}, the --config socket, {SYSTEM_SOCKET} "
                                 "if present, else the daemon's default for this user)")
        parser.add_argument("--config", "-c", default=default(None), metavar="FILE",
                            help="read the socket path from this datadistd TOML file")
        parser.add_argument("--json", action="store_true", default=default(False),
                            help="print JSON (protobuf JSON mapping) instead of a table")
        parser.add_argument("--timeout", type=float, default=default(5.0), metavar="SECONDS",
                            help="deadline of each call (default 5)")

    p = argparse.ArgumentParser(prog="datadistctl", description="Inspect the local datadistd and reach peers.")
    common(p, top=True)
    p.add_argument("--version", action="version", version=f"datadistctl {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, method, render, text in (
        ("status", "GetStatus", render_status, "daemon version, backend, transport, uptime; engines and pools"),
        ("links", "ListLinks", render_links, "links with their state, transport and bytes moved"),
        ("caches", "ListCaches", render_caches, "caches and the keys bound to them"),
    ):
        sp = sub.add_parser(name, help=text, description=text)
        common(sp, top=False)
        sp.add_argument("--engine", type=int, default=0, metavar="ID", help="only this engine (default: all)")
        sp.set_defaults(func=_diagnostic(method, render))
    sp = sub.add_parser("ping", help="gRPC health check of a peer daemon's listen address, with latency",
                        description="Standard gRPC health check (grpc.health.v1) of PEER = host:port, the "
                                    "listen_ip_info of a prompt engine on another node.")
    common(sp, top=False)
    sp.add_argument("peer", metavar="PEER", help="host:port")
    sp.add_argument("--count", "-n", type=int, default=3,
                    help="health checks timed after the first one, which opens the connection (default 3)")
    sp.add_argument("--service", default="", help="health service name (default: the whole server)")
    sp.add_argument("--tls-cert", metavar="PEM", help="client certificate for a peer with [tls] enabled "
                    "(default: [tls] cert_file of --config / DATADISTD_TLS_* when enabled there)")
    sp.add_argument("--tls-key", metavar="PEM", help="private key of --tls-cert")
    sp.add_argument("--tls-ca", metavar="PEM", help="CA bundle the peer's certificate must chain to")
    sp.add_argument("--tls-server-name", metavar="NAME",
                    help="verify the peer's certificate against NAME instead of the host of PEER")
    sp.set_defaults(func=ping)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code = int(args.func(args))
        sys.stdout.flush()   # here, not at exit: a reader that went away (| head -1) is handled below
        return code
    except CtlError as exc:
        print(f"datadistctl: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader of our output is gone: end quietly as `ls | head -1` does (141 = 128 + SIGPIPE); point
        # stdout at /dev/null so the interpreter's final flush does not fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    raise SystemExit(main())
