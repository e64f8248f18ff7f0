"""Typed daemon configuration: TOML file, then ``DATADISTD_<SECTION>_<KEY>`` environment
variables, then command-line flags. Every key is documented here and in ``deploy/datadistd.toml``.

What an engine (one ``LLMDataDist``) chooses — role, cluster id, pool sizes, listen address,
``sync_kv_timeout`` — comes from its ``init`` options; what is node-wide lives here.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from datadist import sockdir

from ..guard.quota import LinkLimits, QuotaLimits

if TYPE_CHECKING:
    from ..core.options import EngineOptions
    from ..guard.admission import AdmissionLimits

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["DEV_SECRET", "RETIRED_KEYS", "is_loopback", "Config", "DaemonSection", "MemorySection", "PeerSection",
           "TlsSection", "TransportSection", "MetricsSection", "QuotaSection", "load_config", "default_socket_path",
           "ConfigError", "parse_listen_address", "env_names", "retired_env_names", "ENV_PREFIX"]

log = logging.getLogger(__name__)

#: the built-in secret of an unconfigured daemon: public, so good for loopback only
DEV_SECRET = "datadist-development-secret"

SECRET_FIX = ("set a secret shared by the cluster's daemons: [peer] secret_file = \"/etc/datadist/peer.secret\" "
              "(first line; mode 0600) or DATADISTD_PEER_SECRET_FILE")


def is_loopback(host: str) -> bool:
    """``host`` (an IP or ``localhost``) is a loopback address; anything else can be reached by other hosts."""
    import ipaddress

    if host.strip("[]") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class ConfigError(ValueError):
    """A config file, environment variable or flag has a bad key or value."""


def default_socket_path() -> str:
    """``$RUNTIME_DIRECTORY`` (systemd), else ``/run/datadist`` as root, else ``$XDG_RUNTIME_DIR/datadist``,
    else ``/tmp/datadist-<uid>`` (which ``secure_socket_dir`` refuses when another user made it first)."""
    runtime = os.environ.get("RUNTIME_DIRECTORY")
    if runtime:
        return str(Path(runtime.split(":")[0]) / "datadistd.sock")
    if os.geteuid() == 0:
        return "/run/datadist/datadistd.sock"
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return str(Path(xdg) / "datadist" / "datadistd.sock")
    return f"/tmp/datadist-{os.getuid()}/datadistd.sock"


def secure_socket_dir(socket_path: str, mode: int = 0o750) -> Path:
    """Create the socket's directory if needed (``mode``) and check nobody else can swap what is in it.

    Every directory from the socket's up to ``/`` must be owned by the daemon's uid or root and be
    writable by nobody else, unless it is a root-owned sticky directory such as ``/tmp`` (where
    others cannot rename or remove our entries). Raises ``ConfigError`` (exit 2) naming the culprit.
    """
    directory = Path(os.path.abspath(socket_path)).parent
    if not directory.exists():
        try:
            directory.mkdir(mode=mode, parents=True)
        except OSError as exc:
            raise ConfigError(f"cannot create the socket directory {directory}: {exc.strerror}") from None
    me = os.geteuid()
    why = sockdir.culprit(str(directory), me)   # the rule the clients check the daemon's directory by, too
    if why:
        raise ConfigError(
            f"socket directory {directory} is not safe: {why}; another user could replace the daemon's sockets "
            f"there. Use a directory owned by uid {me} that only it can write (e.g. systemd's RuntimeDirectory=, "
            "or set [daemon] socket / --socket)")
    return directory


def _doc(text: str, **kw: Any) -> Any:
    return field(metadata={"doc": text}, **kw)


@dataclass
class DaemonSection:
    socket: str = _doc("Unix socket for local workers (the DataDist service). Beside it: <socket>.attach (worker "
                       "identity and memory descriptors, same mode) and <socket>.admin (the whole-node view, mode "
                       "0600: root and the daemon's user). Its directory must be owned by the daemon's user and "
                       "writable by nobody else.", default_factory=default_socket_path)
    socket_mode: int = _doc("Permission bits of the worker and attach sockets (group-accessible, never world).",
                            default=0o660)
    log_level: str = _doc("DEBUG, INFO, WARNING or ERROR.", default="INFO")
    drain_seconds: float = _doc("Grace period for in-flight calls on SIGTERM before the daemon exits.", default=5.0)
    fast_pulls: bool = _doc("A worker's small pull_blocks and push_blocks by BlocksCacheKey over the attach socket "
                            "end on the data connection's reader thread (no task, no event-loop turn for the "
                            "owner's reply); false: every pull and push takes the general path (same bytes and status "
                            "codes, more CPU per transfer).", default=True)


@dataclass
class MemorySection:
    backend: str = _doc("Memory backend by name: host (shared memory; runs everywhere), acl (Ascend NPU memory "
                        "through CANN's runtime; docs/ascend.md).", default="host")
    device_id: int = _doc("acl: the NPU (logical id) of engines whose options name none (ge.exec.deviceId). An "
                          "engine's DEVICE pools, registered NPU memory and hccl links are on its own NPU; one "
                          "daemon serves every NPU the runtime reports.", default=0)
    shm_dir: str = _doc("Where the daemon removes, at start, datadist-<pid>-* files whose daemon is dead. Pools "
                        "themselves are private memfds: no file, no path another process could open.",
                        default="/dev/shm")
    max_total_bytes: int = _doc("Cap on the sum of all engines' pools; 0 = no cap beyond the machine.", default=0)


@dataclass
class PeerSection:
    secret: str = _doc("Shared secret peers prove in the handshake (HMAC-SHA256). Never logged. Empty (and no "
                       "secret_file) = under systemd the node secret made in $STATE_DIRECTORY, else this user's own, "
                       "made on first use (datadistd/ops/peersecret.py): the daemons of one user on one host link, "
                       "embedded or not.", default="")
    secret_file: str = _doc("Read the secret from this file instead (first line). It must be the daemon user's "
                            "(or root's) and closed to group and others (chmod 600), or the start stops.",
                            default="")
    dev_secret_fallback: bool = _doc("No secret configured or made (no state directory, no home): the public one, "
                                     "loopback and socket_mode 0o600 only; false: refuse to start.", default=False)
    default_port: int = _doc("Peer port assumed for a rank-table device_ip without one (comm-domain link).",
                             default=26000)
    heartbeat_seconds: float = _doc("Interval at which a linking daemon pings each peer daemon (one ping per daemon, "
                                    "for all its links); no answer within max(interval, 1 s) breaks every link to "
                                    "it, and a serving daemon drops the links of a daemon silent for 3 intervals.",
                                    default=2.0)
    preauth_seconds: float = _doc("A connection to a peer or data-plane port that has not proved the secret "
                                  "within this long is closed.", default=10.0)
    max_preauth_per_source: int = _doc("Unauthenticated connections one remote address may hold per listener; "
                                       "past it its oldest one is closed.", default=8)
    max_preauth: int = _doc("Unauthenticated connections per listener in all; past it the oldest of the address "
                            "holding most is closed.", default=64)
    max_connections: int = _doc("Connections per listener in all (authenticated included); past it new ones are "
                                "refused.", default=1024)

    def admission(self) -> "AdmissionLimits":
        """The caps every peer and data-plane listener applies (``datadistd.guard.admission``)."""
        from ..guard.admission import AdmissionLimits

        return AdmissionLimits(self.preauth_seconds, self.max_preauth_per_source, self.max_preauth,
                               self.max_connections)


@dataclass
class TlsSection:
    enabled: bool = _doc("Mutual TLS on the peer plane (daemon-to-daemon gRPC): listeners require a client "
                         "certificate from ca_file, linking daemons present cert_file and verify the peer's.",
                         default=False)
    cert_file: str = _doc("This node's certificate chain (PEM): server and client certificate.", default="")
    key_file: str = _doc("The private key of cert_file (PEM); keep it mode 0600.", default="")
    ca_file: str = _doc("CA bundle (PEM) the peers' certificates must chain to.", default="")
    server_name: str = _doc("Verify peer listeners' certificates against this name instead of the address "
                            "dialled (for certificates without IP SANs); empty = the address.", default="")


@dataclass
class TransportSection:
    name: str = _doc("Data-plane transport by name: tcp (default), nixl (NIXL: RDMA fabrics; docs/nixl.md), hccl "
                     "(Ascend). Both ends of a link must set the same. Links between engines of one daemon are "
                     "memory copies whatever is set here.",
                     default="tcp")
    streams: int = _doc("TCP connections per link (each an fd at both ends); large transfers are striped over "
                        "them. 1 by default: on loopback and 2 CPUs one connection carried bulk and 4-64 concurrent "
                        "pulls as fast as four, with lower p99 (docs/performance.md); more may pay on a real "
                        "network with many CPUs.", default=1)
    chunk_bytes: int = _doc("Striping unit; transfers interleave at this granularity.", default=4 << 20)
    connect_timeout_seconds: float = _doc("Deadline for opening data connections.", default=5.0)
    host: str = _doc("Bind address of the data plane of engines that do not listen (loopback by default); "
                     "listening engines bind their listen IP.", default="127.0.0.1")
    data_ports: str = _doc("Ports of the data-plane listeners other hosts reach (those on a non-loopback address: a "
                           "listening engine's listen IP): \"26100\" or a range \"26100-26115\", one port per such "
                           "engine on the node, so a firewall can open exactly these. Empty = a port the kernel "
                           "picks (the default).", default="")
    nixl_backend: str = _doc("nixl: the NIXL backend (UCX, LIBFABRIC); UCX picks its transports and devices from "
                             "UCX_TLS / UCX_NET_DEVICES in the daemon's environment.", default="UCX")
    nixl_fabric_trusted: bool = _doc("nixl: the operator's word that only cluster nodes reach the NIXL backend's "
                                     "endpoints (NIXL authenticates nobody; docs/nixl.md); nixl refuses to start "
                                     "without it.", default=False)
    hccl_device_ip: str = _doc("hccl: the NPUs' RoCE addresses peers reach, overriding hccl_hccn_conf: one address, "
                               "or a comma-separated list by PHYSICAL NPU id (\"10.0.0.1,10.0.0.2,...\"); empty = "
                               "derived as CANN derives it (hccl_hccn_conf, else hccl_hccn_tool). An engine's "
                               "llm.LocalCommRes device_ip comes first.", default="")
    hccl_hccn_conf: str = _doc("hccl: the node's NPU NIC addresses, address_<physical id>=<ip> (CANN reads "
                               "/etc/hccn.conf; hixl hixl_utils.cc GetDeviceIp).", default="/etc/hccn.conf")
    hccl_hccn_tool: str = _doc("hccl: hccn_tool, asked `-i <physical id> -ip -g` when hccl_hccn_conf does not exist "
                               "(else hccn_tool on PATH).", default="/usr/local/Ascend/driver/tools/hccn_tool")
    hccl_device_port: int = _doc("hccl: the rank table's device_port, where the engines' communicators listen on their "
                                 "NPU's NIC; a worker's own HCCL listens on 16666 there. 0 = 16666.", default=16667)
    hccl_rdma_traffic_class: int = _doc("hccl: RDMA traffic class of the links' communicators of engines that do "
                                        "not set llm.RdmaTrafficClass; -1 = HCCL's default.", default=-1)
    hccl_rdma_service_level: int = _doc("hccl: RDMA service level of engines that do not set llm.RdmaServiceLevel; "
                                        "-1 = HCCL's default.", default=-1)
    hccl_link_retry_count: int = _doc("hccl: HcclCommPrepare tries per link of engines that do not set "
                                      "llm.LinkRetryCount (1..100).", default=1)
    hccl_link_total_seconds: float = _doc("hccl: time all HcclCommPrepare tries of a link share, for engines that do "
                                          "not set llm.LinkTotalTime.", default=10.0)

    def data_port_range(self) -> tuple[int, int] | None:
        """``data_ports`` as an inclusive (first, last) pair; None when empty. ValueError names what is wrong."""
        text = self.data_ports.strip()
        if not text:
            return None
        first, sep, last = text.partition("-")
        try:
            lo, hi = int(first), int(last if sep else first)
        except ValueError:
            raise ValueError(f'expected "port" or "first-last", got {self.data_ports!r}') from None
        if not 1 <= lo <= hi <= 65535:
            raise ValueError(f"expected ports in [1, 65535], first <= last; got {self.data_ports!r}")
        return lo, hi

    def device_ip(self, physical: int) -> str:
        """``hccl_device_ip`` of physical NPU ``physical`` ("" when not configured)."""
        ips = [ip.strip() for ip in self.hccl_device_ip.split(",")] if self.hccl_device_ip.strip() else []
        if len(ips) == 1:
            return ips[0]
        return ips[physical] if 0 <= physical < len(ips) else ""

    def settings(self, host: str, device_id: int = 0, engine: "EngineOptions | None" = None) -> dict[str, object]:
        """The keyword arguments of the named transport for an engine whose data plane binds ``host``: for hccl,
        on NPU ``device_id``, with the engine's CANN options (``llm.RdmaTrafficClass``, ``llm.RdmaServiceLevel``,
        ``llm.LinkRetryCount``, ``llm.LinkTotalTime``, ``llm.LocalCommRes``) over this section's defaults."""
        common: dict[str, object] = {"host": host, "port": 0, "chunk_size": self.chunk_bytes,
                                     "connect_timeout": self.connect_timeout_seconds,
                                     "ports": None if is_loopback(host) else self.data_port_range()}
        if self.name == "nixl":
            return {**common, "backend": self.nixl_backend}
        if self.name == "hccl":
            e = engine
            res = e.comm_res if e is not None else None
            tc = e.rdma_traffic_class if e is not None else None
            sl = e.rdma_service_level if e is not None else None
            retries = e.link_retry_count if e is not None else None
            return {**common, "device_id": device_id,
                    "device_ip": res.device_ip if res and res.device_ip else "",
                    "device_ips": self.hccl_device_ip, "hccn_conf": self.hccl_hccn_conf,
                    "hccn_tool": self.hccl_hccn_tool, "device_port": self.hccl_device_port,
                    "server_id": res.server_id if res and res.server_id else "",
                    "physical_id": res.device_id if res is not None and res.device_id is not None else -1,
                    "traffic_class": self.hccl_rdma_traffic_class if tc is None else tc,
                    "service_level": self.hccl_rdma_service_level if sl is None else sl,
                    "retries": self.hccl_link_retry_count if retries is None else retries,
                    "prepare_timeout": float(e.link_total_time_s) if e is not None and e.link_total_time_s > 0
                    else self.hccl_link_total_seconds}
        return common


@dataclass
class MetricsSection:
    listen: str = _doc("Prometheus exposition address host:port (GET /metrics); empty = off; a bare port "
                       "binds loopback.", default="")


@dataclass
class QuotaSection:
    imported_bytes_per_uid: int = _doc("Bytes of worker memory one uid's workers may have handed over at once "
                                       "(ImportMemory, counted while the daemon holds it); over it "
                                       "LLM_OUT_OF_MEMORY. 0 = no limit.", default=1 << 40)
    imported_mappings_per_uid: int = _doc("Descriptors (each a mapping or a held file) one uid's imports may keep "
                                          "in the daemon at once; the kernel's vm.max_map_count (65530) is for "
                                          "every tenant together. 0 = no limit.", default=8192)
    engines_per_uid: int = _doc("Engines (Init) one uid may have at once. 0 = no limit.", default=64)
    pools_per_uid: int = _doc("Memory pools (MemPoolConfig / HostMemPoolConfig) of one uid's engines at once. "
                              "0 = no limit.", default=128)
    assembly_bytes_per_uid: int = _doc("Bytes of block numbers one uid's transfers being assembled from attach "
                                       "continuation frames may announce at once (8 per number, booked at a "
                                       "transfer's first frame, given back when it is whole, refused or its "
                                       "connection closes); over it LLM_OUT_OF_MEMORY. A transfer announces at "
                                       "most 16 MiB, so the default is four of the largest at once. 0 = no limit.",
                                       default=64 << 20)
    link_calls_in_flight: int = _doc("Owner calls (reads, commits) the other end of one link may have running at "
                                     "this daemon at once (each may hold an executor thread); more wait for a "
                                     "turn until their deadline, more than 1024 waiting get LLM_LINK_BUSY. "
                                     "0 = no limit.", default=16)
    link_open_writes: int = _doc("Write transfers (parts) the other end of one link may hold open at once. "
                                 "0 = no limit.", default=8192)
    link_pinned_bytes: int = _doc("Bytes of this daemon's caches one link's open writes may pin at once. "
                                  "0 = no limit.", default=64 << 30)
    threads_per_principal: int = _doc("Threads of the daemon's executor (128) one principal may hold at once: a "
                                      "uid's local work (copies, pulls, pushes of its engines) or one peer "
                                      "address's owner calls over all its links. More wait for a turn on the event "
                                      "loop, holding no thread, so one principal never fills the executor. "
                                      "0 = no limit (one shared pool).", default=32)
    link_max_wait_ms: int = _doc("The longest timeout or hold time a peer's owner call may ask for; longer ones "
                                 "are cut to this. 0 = no limit.", default=600_000)

    def limits(self) -> QuotaLimits:
        return QuotaLimits(self.imported_bytes_per_uid, self.imported_mappings_per_uid, self.engines_per_uid,
                           self.pools_per_uid, self.assembly_bytes_per_uid)

    def link_limits(self) -> LinkLimits:
        return LinkLimits(self.link_calls_in_flight, self.link_open_writes, self.link_pinned_bytes,
                          self.link_max_wait_ms)


@dataclass
class Config:
    daemon: DaemonSection = field(default_factory=DaemonSection)
    memory: MemorySection = field(default_factory=MemorySection)
    peer: PeerSection = field(default_factory=PeerSection)
    tls: TlsSection = field(default_factory=TlsSection)
    transport: TransportSection = field(default_factory=TransportSection)
    metrics: MetricsSection = field(default_factory=MetricsSection)
    quota: QuotaSection = field(default_factory=QuotaSection)

    def with_overrides(self, overrides: Mapping[str, Any]) -> "Config":
        """A copy with ``{"section.key": value}`` applied (values coerced to the field type)."""
        cfg = dataclasses.replace(self, **{f.name: dataclasses.replace(getattr(self, f.name)) for f in fields(self)})
        for dotted, value in overrides.items():
            _set(cfg, dotted, value)
        return cfg


def _coerce(kind: Any, value: Any, where: str) -> Any:
    kind = kind if isinstance(kind, type) else {"int": int, "float": float, "bool": bool, "str": str}.get(kind, str)
    try:
        if kind is bool:
            if isinstance(value, bool):
                return value
            if str(value).lower() in ("1", "true", "yes", "on"):
                return True
            if str(value).lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if kind is int and isinstance(value, str):
            return int(value, 0)
        return kind(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: expected {kind.__name__}, got {value!r}") from None


#: keys the daemon does not read, and why: a file, variable or flag setting one loads with a warning (any other
#: unknown key is refused), so a config file written for an earlier release still starts the daemon
RETIRED_KEYS = {
    "memory.file_mode": "pools are private memfds, not files",
    "peer.max_clock_skew_seconds": "the serving daemon issues each handshake's single-use challenge",
}


def _set(cfg: Config, dotted: str, value: Any) -> None:
    if dotted in RETIRED_KEYS:
        log.warning("config key %s is not read (%s): ignored; remove it", dotted, RETIRED_KEYS[dotted])
        return
    section_name, _, key = dotted.partition(".")
    section = getattr(cfg, section_name, None)
    if section is None or not dataclasses.is_dataclass(section):
        raise ConfigError(f"unknown config section {section_name!r} (in {dotted!r}); "
                          f"known: {', '.join(f.name for f in fields(cfg))}")
    names = {f.name: f for f in fields(section)}
    if key not in names:
        raise ConfigError(f"unknown config key {dotted!r}{_nearest(key, names)}; known in [{section_name}]: "
                          f"{', '.join(names)}")
    setattr(section, key, _coerce(names[key].type, value, dotted))


def load_config(path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None,
                overrides: Mapping[str, Any] | None = None) -> Config:
    """File, then ``DATADISTD_SECTION_KEY`` environment variables, then ``overrides``."""
    cfg = Config()
    if path:
        try:
            data = tomllib.loads(Path(path).read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path}: {exc}") from None
        for section_name, table in data.items():
            if not isinstance(table, dict):
                raise ConfigError(f"config file {path}: top-level key {section_name!r} must be a [section]")
            for key, value in table.items():
                _set(cfg, f"{section_name}.{key}", value)
    env = os.environ if env is None else env
    known = {**env_names(cfg), **retired_env_names()}
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX):
            continue
        if name not in known:   # a misspelt variable is an error, as a misspelt key in the file is
            raise ConfigError(f"unknown environment variable {name}{_nearest(name, known)}; every {ENV_PREFIX}* "
                              f"variable is a [section] key of the config file ({ENV_PREFIX}<SECTION>_<KEY>, "
                              "deploy/datadistd.toml)")
        _set(cfg, known[name], value)
    for dotted, value in (overrides or {}).items():
        if value is not None:
            _set(cfg, dotted, value)
    _check(cfg)
    return cfg


#: every environment variable that configures the daemon starts with this; each names a key (``env_names``)
ENV_PREFIX = "DATADISTD_"


def env_names(cfg: Config | None = None) -> dict[str, str]:
    """``{"DATADISTD_SECTION_KEY": "section.key"}`` for every key of the config."""
    cfg = cfg or Config()
    return {f"{ENV_PREFIX}{s.name}_{k.name}".upper(): f"{s.name}.{k.name}"
            for s in fields(cfg) for k in fields(getattr(cfg, s.name))}


def retired_env_names() -> dict[str, str]:
    """``{"DATADISTD_SECTION_KEY": "section.key"}`` for every key of ``RETIRED_KEYS``."""
    return {f"{ENV_PREFIX}{dotted.replace('.', '_')}".upper(): dotted for dotted in RETIRED_KEYS}


def _nearest(name: str, candidates: Iterable[str]) -> str:
    """``" (did you mean X?)"`` for the closest of ``candidates`` to ``name`` (or "" when none is close)."""
    import difflib

    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def parse_listen_address(listen: str) -> tuple[str, int]:
    """``"host:port"``, ``"[v6]:port"``, ``":port"`` or ``"port"`` -> (host, port); no host = loopback."""
    text = listen.strip()
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "", text
    host = host.strip("[]") or "127.0.0.1"
    try:
        number = int(port)
    except ValueError:
        raise ValueError(f"expected host:port, got {listen!r}") from None
    if not 0 <= number <= 65535:
        raise ValueError(f"port out of range in {listen!r}")
    return host, number


#: durations that are intervals of a repeating job: zero would spin
_INTERVALS = ("peer.heartbeat_seconds",)


def _check_durations(cfg: Config) -> None:
    """Every ``*_seconds`` key is a finite number of seconds, never negative; an interval is more than zero."""
    for section, values in dataclasses.asdict(cfg).items():
        for key, value in values.items():
            if not key.endswith("_seconds"):
                continue
            dotted = f"{section}.{key}"
            if not math.isfinite(value) or value < 0 or (dotted in _INTERVALS and value == 0):
                bound = "more than 0" if dotted in _INTERVALS else "0 or more"
                raise ConfigError(f"{dotted}: expected a number of seconds, {bound}; got {value!r}")


def _check(cfg: Config) -> None:
    """Values a type alone does not pin down."""
    _check_durations(cfg)
    if cfg.daemon.log_level.upper() not in LOG_LEVELS:
        raise ConfigError(f"daemon.log_level: expected one of {', '.join(LOG_LEVELS)}, got {cfg.daemon.log_level!r}")
    mode = cfg.daemon.socket_mode
    if not 0 <= mode <= 0o777 or mode & 0o007:  # the sockets stay private to the node
        raise ConfigError(f"daemon.socket_mode: {mode:#o} would give the world access; use group bits only "
                          "(e.g. 0o660)")
    if cfg.tls.enabled:
        missing = [key for key in ("cert_file", "key_file", "ca_file") if not getattr(cfg.tls, key)]
        if missing:
            raise ConfigError(f"tls.enabled needs {', '.join('tls.' + key for key in missing)}")
    from ..memory import BACKENDS
    from ..transport import TRANSPORTS

    if cfg.memory.backend not in BACKENDS:
        raise ConfigError(f"memory.backend: unknown memory backend {cfg.memory.backend!r}; known: "
                          f"{', '.join(sorted(BACKENDS))}")

    if cfg.transport.name not in TRANSPORTS:
        raise ConfigError(f"transport.name: unknown transport {cfg.transport.name!r}; known: "
                          f"{', '.join(sorted(TRANSPORTS))}")
    if cfg.transport.name == "nixl":
        if not cfg.transport.nixl_fabric_trusted:
            raise ConfigError("transport.name = 'nixl' moves KV bytes through NIXL, whose backends authenticate "
                              "nobody: set transport.nixl_fabric_trusted = true once only cluster nodes can reach "
                              "the fabric (UCX_NET_DEVICES; docs/nixl.md)")
        import importlib.util

        from ..transport.nixl.ucx import MODULES, PACKAGE
        if not any(importlib.util.find_spec(m) for m in MODULES):
            raise ConfigError(f"transport.name = 'nixl' needs NIXL: pip install --no-deps {PACKAGE} (or make nixl)")
    try:
        cfg.peer.admission()
    except ValueError as exc:
        raise ConfigError(f"[peer] connection caps: {exc}") from None
    try:
        cfg.transport.data_port_range()
    except ValueError as exc:
        raise ConfigError(f"transport.data_ports: {exc}") from None
    if cfg.metrics.listen:
        try:
            parse_listen_address(cfg.metrics.listen)
        except ValueError as exc:
            raise ConfigError(f"metrics.listen: {exc}") from None
    # [transport] host against the secret: Node, once the secret is known (datadistd.ops.peersecret)
