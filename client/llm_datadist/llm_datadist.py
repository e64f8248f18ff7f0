"""``LLMDataDist``: CANN's entry class, backed by a datadistd engine.

One initialized instance per process (CANN's rule); ``init`` connects to the daemon named by
the ``datadist.daemon`` option or ``DATADIST_DAEMON`` (e.g. ``unix:///run/datadist/datadistd.sock``)
and otherwise starts an embedded daemon inside this process.
"""

from __future__ import annotations

import atexit
import json
import logging
import threading
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Union

from datadist.v1 import common_pb2, datadist_pb2

from . import _validate as v
from ._daemon import DAEMON_ENV, DAEMON_OPTION, OpenEngine, close_engine, open_engine
from ._rpc import RPC_MARGIN_S, DaemonClient
from .configs import LLMClusterInfo, LLMRole, _ip_int_to_str
from .status import LLMException, LLMStatusCode, code_2_status

if TYPE_CHECKING:
    from ._embedded import EmbeddedDaemon
    from .cache_manager import CacheManager
    from .kv_cache_manager import KvCacheManager
    from .llm_model import LLMReq, ModelRunner

__all__ = ["LLMDataDist", "DAEMON_OPTION", "DAEMON_ENV"]

log = logging.getLogger(__name__)

_ROLE_OPTION = {LLMRole.PROMPT: "Prompt", LLMRole.DECODER: "Decoder", LLMRole.MIX: "Mix"}
_NOT_INITIALIZED = "llm datadist is not initialized"


#: the llm.* option keys datadist reads (LLMConfig, ModelConfig and what init derives); ge.* keys are GE's,
#: which CANN hands on and datadist reads only a few of, so they are not warned about
_KNOWN_OPTIONS = frozenset({
    DAEMON_OPTION, "llm.BufPoolCfg", "llm.ClusterInfo", "llm.EnableCacheManager", "llm.EnableRemoteCacheAccessible",
    "llm.EnableSwitchRole", "llm.GlobalResourceConfig", "llm.HostMemPoolConfig", "llm.LinkRetryCount",
    "llm.LinkTotalTime", "llm.ListenIp", "llm.ListenPort", "llm.LocalCommRes", "llm.MemPoolConfig",
    "llm.MemoryUtilization", "llm.OutputMaxSize", "llm.RdmaServiceLevel", "llm.RdmaTrafficClass",
    "llm.RefInputDtypes", "llm.RefInputSeqLenDimIndex", "llm.RefInputShapes", "llm.Role", "llm.SyncKvCacheWaitTime",
    "llm.TransferBackend", "llm.deployResPath", "llm.kvTensorFormat", "llm.listenIpInfo"})


def _warn_unknown_options(options: Dict[str, str]) -> None:
    """CANN ignores option keys it does not know (its engines look up the keys they read), and so does datadist
    (docs/choices.md); a key nobody reads is most likely a typo, so say so once, in the worker's log."""
    unknown = sorted(k for k in options if k not in _KNOWN_OPTIONS and not k.startswith("ge."))
    if unknown:
        log.warning("init options datadist does not read are ignored (as CANN ignores them): %s; a typo?",
                    ", ".join(unknown))


def _setup_engine_option(role: LLMRole, options: Dict[str, str]) -> Dict[str, str]:
    """CANN's ``_setup_engine_option`` (docs/spec.md §3.2)."""
    opts = dict(options)
    opts["llm.Role"] = _ROLE_OPTION[role]
    if "llm.LocalCommRes" in opts:
        opts.setdefault("llm.EnableCacheManager", "1")
        opts.setdefault("llm.EnableRemoteCacheAccessible", "1")
        v.raise_if_false(opts["llm.EnableCacheManager"] == "1", "llm.LocalCommRes requires cache manager mode")
    cache_manager = opts.get("llm.EnableCacheManager") == "1"
    if "llm.TransferBackend" in opts:
        v.raise_if_false(cache_manager, "transfer_backend requires enable_cache_manager")
        opts.setdefault("llm.EnableRemoteCacheAccessible", "1")
        v.raise_if_false(opts["llm.EnableRemoteCacheAccessible"] == "1",
                         "transfer_backend requires enable_remote_cache_accessible")
        v.raise_if_false("llm.listenIpInfo" in opts, "transfer_backend requires listen_ip_info")
    if cache_manager and opts.get("llm.listenIpInfo"):
        info = opts["llm.listenIpInfo"]
        ip, sep, port = info.rpartition(":")
        v.raise_if_false(bool(sep) and bool(ip) and port.isdigit() and ";" not in info,
                         f'listen_ip_info must be exactly "ip:port", got {info!r}')
        opts["llm.ListenIp"] = ip
        opts["llm.ListenPort"] = port
    flow = opts.get("ge.flowGraphMemMaxSize")
    if flow is not None:
        v.raise_if_false(str(flow).isdigit(), f"ge.flowGraphMemMaxSize must be one decimal number, got {flow!r}")
    return opts


def _gen_cluster_info_if_not_exist(cluster_id: int, role: LLMRole, opts: Dict[str, str]) -> None:
    """v1 mode: CANN's ``EngineConfig.gen_cluster_info_if_not_exist`` (docs/spec.md §3.2), minus the NUMA stub file."""
    if "llm.ClusterInfo" in opts:
        return
    device_ids = opts.get("ge.exec.deviceId")
    v.raise_if_false(device_ids is not None, "neither llm.ClusterInfo nor ge.exec.deviceId was specified")
    devices = str(device_ids).split(";")
    for dev in devices:
        v.raise_if_false(dev.isdigit(), f'ge.exec.deviceId is invalid, value="{device_ids}", it should be composed '
                                        f"of numbers, separated by semicolons.")
    info: Dict[str, object] = {"cluster_id": cluster_id, "logic_device_id": [f"0:0:{i}:0" for i in range(len(devices))]}
    if role == LLMRole.PROMPT:
        v.raise_if_false("llm.listenIpInfo" in opts, "neither llm.ClusterInfo nor llm.listenIp was specified")
        subs = opts["llm.listenIpInfo"].split(";")
        v.raise_if_false(len(subs) == len(devices), f"listen ip info num:{len(subs)} in llm.listenIpInfo is not "
                                                    f"equal to device num:{len(devices)}.")
        infos = []
        for sub in subs:
            ip_port = sub.split(":")
            v.raise_if_false(len(ip_port) == 2 and ip_port[1].isdigit(),
                             f'llm.listenIpInfo "{sub}" is invalid, format should be "ip:port"')
            infos.append({"ip": ip_port[0], "port": int(ip_port[1])})
        info["listen_ip_info"] = infos
    from .configs import LLMConfig

    config = LLMConfig()
    config.cluster_info = json.dumps(info)  # string IPs become CANN's little-endian ints
    opts["llm.ClusterInfo"] = config.cluster_info
    v.raise_if_false(len(devices) == 1, "one LLMDataDist drives one device here; run one worker per device "
                                        "(single-process multi-device mode is not supported)",
                     status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED)


def _cluster_pb(info: LLMClusterInfo) -> datadist_pb2.ClusterLink:
    msg = datadist_pb2.ClusterLink(remote_cluster_id=info.remote_cluster_id)
    for ip, port in info.local_ip_info_list:
        msg.local_ip_info.add(ip=_ip_int_to_str(ip), port=port)
    for ip, port in info.remote_ip_info_list:
        msg.remote_ip_info.add(ip=_ip_int_to_str(ip), port=port)
    return msg


def _say_why(call: str, msgs: List[datadist_pb2.ClusterLink], resp: datadist_pb2.LinkClustersResponse
             ) -> Tuple[LLMStatusCode, List[LLMStatusCode]]:
    """The codes of a ``link_clusters`` / ``unlink_clusters`` answer; CANN returns codes only, so every cluster
    that failed is logged here with the daemon's reason (an older daemon sends none)."""
    codes = [code_2_status(s) for s in resp.statuses]
    reasons = list(resp.reasons)
    if len(reasons) == 1:   # a call refused whole: one reason stands for every cluster
        reasons *= len(codes)
    for i, (msg, code) in enumerate(zip(msgs, codes, strict=False)):
        if code != LLMStatusCode.LLM_SUCCESS:
            reason = reasons[i] if i < len(reasons) and reasons[i] else "the daemon gave no reason"
            log.warning("%s: cluster %d: %s: %s", call, msg.remote_cluster_id, code.name, reason)
    return code_2_status(resp.status), codes


def _unanswered(call: str, msgs: List[datadist_pb2.ClusterLink], exc: LLMException, failed: LLMStatusCode
                ) -> Tuple[LLMStatusCode, List[LLMStatusCode]]:
    """The codes of a ``link_clusters`` / ``unlink_clusters`` call the daemon refused whole or never answered (it
    died, restarted, or did not answer in time): CANN returns link failures as codes, so every cluster gets
    ``LLM_TIMEOUT`` or ``failed`` and the reason is logged; a bad argument (``LLM_PARAM_INVALID``) is raised."""
    if exc.status_code == LLMStatusCode.LLM_PARAM_INVALID:
        raise exc
    code = LLMStatusCode.LLM_TIMEOUT if exc.status_code == LLMStatusCode.LLM_TIMEOUT else failed
    log.warning("%s: %d clusters: %s: %s", call, len(msgs), code.name, exc)
    return code, [code] * len(msgs)


class LLMDataDist:
    """``LLMDataDist(role, cluster_id)``; call ``init(options)`` before anything else."""

    llm_engine_instance: Optional["LLMDataDist"] = None
    _instance_lock = threading.Lock()

    def __init__(self, role: LLMRole, cluster_id: int) -> None:
        """An unconnected instance; ``init`` connects it.

        Args:
            role: ``LLMRole.PROMPT``, ``DECODER`` or ``MIX``.
            cluster_id: this node's cluster id (uint64), unique among the nodes it links with.

        Raises:
            TypeError, ValueError: ``role`` not an ``LLMRole``, ``cluster_id`` not a uint64.
        """
        v.check_isinstance("role", role, [LLMRole], allow_none=False)
        v.check_uint64("cluster_id", cluster_id)
        self._role = role
        self._cluster_id = cluster_id
        self._is_initialized = False
        self._client: DaemonClient | None = None
        self._embedded: "EmbeddedDaemon | None" = None
        self._opened: OpenEngine | None = None
        self._engine_id = 0
        self._device_id = 0
        self._options: Dict[str, str] = {}
        self._cache_manager: "CacheManager | None" = None
        self._kv_cache_manager: "KvCacheManager | None" = None
        self._enable_cache_manager = False
        self._is_call_linked = False
        self._models: list = []

    # ---- life cycle ----------------------------------------------------------------------------

    def init(self, options: Dict[str, str]) -> None:
        """Connect to datadistd and create this node's engine; a no-op when already initialized.

        The daemon is named by the ``datadist.daemon`` option or ``DATADIST_DAEMON``; without either an embedded daemon
        starts inside this process. ``llm.EnableCacheManager = "1"`` selects the ``CacheManager`` (v2), else the
        ``KvCacheManager`` (v1).

        Args:
            options: the init options (``LLMConfig.generate_options()``), ``str`` to ``str``.

        Raises:
            TypeError: ``options`` is not a ``dict[str, str]``.
            LLMException: ``LLM_FAILED`` (another initialized ``LLMDataDist`` in this process; no daemon at the named
                address or not ready within 10 s), ``LLM_PARAM_INVALID`` (an option the daemon refuses),
                ``LLM_FEATURE_NOT_ENABLED`` (more than one device), ``LLM_OUT_OF_MEMORY`` (a pool larger than the node
                has), or another status the daemon answers.
        """
        if self._is_initialized:
            return
        v.check_dict("options", options, str, str, allow_none=False)
        with LLMDataDist._instance_lock:
            if LLMDataDist.llm_engine_instance is not None and LLMDataDist.llm_engine_instance is not self:
                raise LLMException("Cannot init multiple LLMDataDists", status_code=LLMStatusCode.LLM_FAILED)
            opts = _setup_engine_option(self._role, options)
            _warn_unknown_options(opts)
            if opts.get("llm.EnableCacheManager") != "1":
                _gen_cluster_info_if_not_exist(self._cluster_id, self._role, opts)
            opened = open_engine(self._cluster_id, int(self._role), opts, opts.pop(DAEMON_OPTION, None))
            self._opened = opened
            self._client, self._embedded, self._engine_id, self._options = (opened.client, opened.embedded,
                                                                            opened.engine_id, opts)
            self._device_id = opened.device_id   # this process's logical id of the engine's NPU
            self._enable_cache_manager = opts.get("llm.EnableCacheManager") == "1"
            if self._enable_cache_manager:
                from .cache_manager import CacheManager

                self._cache_manager = CacheManager(self, opts)
            else:
                from .kv_cache_manager import KvCacheManager

                self._kv_cache_manager = KvCacheManager(self, self._role)
            self._models = []
            self._is_initialized = True
            LLMDataDist.llm_engine_instance = self
        log.info("llm_datadist initialized: cluster %s role %s engine %s via %s", self._cluster_id, self._role.name,
                 self._engine_id, opened.where)

    def finalize(self) -> None:
        """Release the engine and everything it holds (caches, links, pools); a no-op when not initialized.

        An engine the daemon already released (it stopped or restarted) is logged, not raised. Not to run concurrently
        with other calls of this instance.

        Raises:
            Nothing: failures are logged.
        """
        if not self._is_initialized:
            return
        for model in self._models:
            model._close()
        self._models = []
        for manager in (self._cache_manager, self._kv_cache_manager):
            if manager is not None:
                manager._finalize()
        try:
            if self._opened is not None:
                close_engine(self._opened)
        finally:
            for manager in (self._cache_manager, self._kv_cache_manager):
                if manager is not None:   # after the daemon's finalize (or the lease's end): importer first
                    manager._release_exports()
            self._client, self._embedded, self._opened = None, None, None
            self._is_initialized = False
            with LLMDataDist._instance_lock:
                if LLMDataDist.llm_engine_instance is self:
                    LLMDataDist.llm_engine_instance = None

    # ---- plumbing for the managers -------------------------------------------------------------

    def _check_init(self) -> DaemonClient:
        if not self._is_initialized or self._client is None:
            raise RuntimeError(_NOT_INITIALIZED)
        return self._client

    def _call(self, method: str, request: object, func_name: str, timeout: float | None = None) -> Any:
        return self._check_init().call(method, request, func_name, timeout)

    @property
    def _sync_kv_timeout_s(self) -> float:
        return int(self._options.get("llm.SyncKvCacheWaitTime", "1000")) / 1000

    # ---- links ---------------------------------------------------------------------------------

    def _clusters(self, clusters: Union[List[LLMClusterInfo], Tuple[LLMClusterInfo, ...]]) -> list:
        v.check_isinstance("clusters", clusters, [list, tuple], allow_none=False)
        for cluster in clusters:
            v.check_isinstance("cluster", cluster, [LLMClusterInfo], allow_none=False)
            v.check_uint64("remote_cluster_id", cluster.remote_cluster_id)  # CANN: None is a TypeError, not 0
        v.raise_if_false(len(clusters) > 0, "clusters must not be empty")
        return [_cluster_pb(c) for c in clusters]

    def link_clusters(self, clusters: Union[List[LLMClusterInfo], Tuple[LLMClusterInfo, ...]],
                      timeout: int = 3000) -> Tuple[LLMStatusCode, List[LLMStatusCode]]:
        """Link to the listed clusters (this node is the client; they listen).

        Args:
            clusters: ``LLMClusterInfo`` per remote cluster: its id and listen address (``remote_ip_info``), in v2 also
                this node's own address (``local_ip_info``) unless ``llm.LocalCommRes`` is set.
            timeout: milliseconds, int32 > 0, for the whole call.

        Returns:
            The overall ``LLMStatusCode`` (``LLM_SUCCESS`` only when every link succeeded) and one code per cluster
            (``LLM_ALREADY_LINK``, ``LLM_LINK_FAILED``, ``LLM_TIMEOUT``, ...; ``LLM_LINK_FAILED`` for every cluster
            when this worker's daemon is gone): link failures are returned, not raised.

        Raises:
            RuntimeError: before ``init`` or after ``finalize`` ("llm datadist is not initialized").
            TypeError, ValueError: an argument of the wrong type or out of its integer range.
            LLMException: ``LLM_PARAM_INVALID`` (no clusters, ``timeout`` <= 0, a v2 cluster without ``local_ip_info``).
        """
        self._check_init()
        v.check_int32("timeout", timeout)
        v.raise_if_false(timeout > 0, f"timeout must be > 0, got {timeout}")
        msgs = self._clusters(clusters)
        if self._enable_cache_manager and self._options.get("llm.LocalCommRes", "") == "":
            for c in clusters:
                v.raise_if_false(len(c.local_ip_info_list) > 0 or "llm.LocalCommRes" in self._options,
                                 f"cluster {c.remote_cluster_id} needs local_ip_info")
        try:
            resp = self._call("LinkClusters", datadist_pb2.LinkClustersRequest(
                engine_id=self._engine_id, clusters=msgs, timeout_ms=timeout), "link_clusters",
                timeout / 1000 + RPC_MARGIN_S)
        except LLMException as exc:
            return _unanswered("link_clusters", msgs, exc, LLMStatusCode.LLM_LINK_FAILED)
        return _say_why("link_clusters", msgs, resp)

    def unlink_clusters(self, clusters: Union[List[LLMClusterInfo], Tuple[LLMClusterInfo, ...]],
                        timeout: int = 3000, force: bool = False) -> Tuple[LLMStatusCode, List[LLMStatusCode]]:
        """Unlink from the listed clusters.

        Args:
            clusters: ``LLMClusterInfo`` per remote cluster (its id and listen address).
            timeout: milliseconds, int32 > 0, for the whole call.
            force: True: drop only this end (call it on both); False: tear down both ends.

        Returns:
            The overall ``LLMStatusCode`` and one code per cluster (``LLM_NOT_YET_LINK`` for a cluster not linked;
            ``LLM_UNLINK_FAILED`` for every cluster when this worker's daemon is gone): failures are returned, not
            raised.

        Raises:
            RuntimeError: before ``init`` or after ``finalize`` ("llm datadist is not initialized").
            TypeError, ValueError: an argument of the wrong type or out of its integer range.
            LLMException: ``LLM_PARAM_INVALID`` (no clusters, ``timeout`` <= 0).
        """
        self._check_init()
        v.check_int32("timeout", timeout)
        v.raise_if_false(timeout > 0, f"timeout must be > 0, got {timeout}")
        v.check_isinstance("force", force, [bool], allow_none=False)
        msgs = self._clusters(clusters)
        try:
            resp = self._call("UnlinkClusters", datadist_pb2.UnlinkClustersRequest(
                engine_id=self._engine_id, clusters=msgs, timeout_ms=timeout, force=force), "unlink_clusters",
                timeout / 1000 + RPC_MARGIN_S)
        except LLMException as exc:
            return _unanswered("unlink_clusters", msgs, exc, LLMStatusCode.LLM_UNLINK_FAILED)
        return _say_why("unlink_clusters", msgs, resp)

    def switch_role(self, role: LLMRole, switch_options: Optional[Dict[str, str]] = None) -> None:
        """Change this node's role, and (v2) start or stop listening.

        v2: the same role is allowed; ``llm.listenIpInfo`` in ``switch_options`` (re)starts listening there, without
        it the listener closes. v1: the role must change, PROMPT needs ``llm.listenIpInfo``, and ``enable_switch_role``
        must have been set at init.

        Args:
            role: the new ``LLMRole``.
            switch_options: ``str`` to ``str`` options; ``llm.listenIpInfo`` = ``"ip:port"``.

        Raises:
            RuntimeError: before ``init`` or after ``finalize`` ("llm datadist is not initialized").
            TypeError: ``role`` not an ``LLMRole``, ``switch_options`` not a ``dict[str, str]``.
            LLMException: ``LLM_PARAM_INVALID`` (v1: the same role, PROMPT without ``llm.listenIpInfo``; a malformed
                address), ``LLM_FEATURE_NOT_ENABLED`` (v1 without ``enable_switch_role``), ``LLM_EXIST_LINK`` (links
                exist: unlink first).
        """
        self._check_init()
        v.check_isinstance("role", role, [LLMRole], allow_none=False)
        if not self._enable_cache_manager:
            v.raise_if_false(self._role != role, f"role not changed, role = {role.name}")
        v.check_dict("switch_options", switch_options, str, str)
        options = dict(switch_options or {})
        if not self._enable_cache_manager and role == LLMRole.PROMPT:
            v.raise_if_false("llm.listenIpInfo" in options,
                             'Failed to switch to Prompt, option "llm.listenIpInfo" was not specified')
        if "llm.listenIpInfo" in options:
            info = options["llm.listenIpInfo"]
            ip, sep, port = info.rpartition(":")
            v.raise_if_false(bool(sep) and bool(ip) and port.isdigit(),
                             f'llm.listenIpInfo "{info}" is invalid, format should be "ip:port"')
            options["llm.ListenIp"], options["llm.ListenPort"] = ip, port
        self._call("SwitchRole", datadist_pb2.SwitchRoleRequest(
            engine_id=self._engine_id, role=int(role), options=options), "switch_role")
        if self._kv_cache_manager is not None:
            self._kv_cache_manager._switch_role(role)
        self._role = role

    def link(self, comm_name: str, cluster_rank_info: Dict[int, int], rank_table: str) -> int:
        """Create a comm domain with the other members (v2 only; every member calls it at once).

        Args:
            comm_name: the domain's name, 1 to 127 characters.
            cluster_rank_info: cluster id (uint64) to rank (uint32), 2 to 4 members, ranks ascending in dict order.
            rank_table: the HCCL rank table (JSON).

        Returns:
            The comm id (uint64) for ``unlink`` and ``query_register_mem_status``.

        Raises:
            RuntimeError: before ``init`` or after ``finalize`` ("llm datadist is not initialized").
            TypeError, ValueError: an argument of the wrong type or out of its integer range.
            LLMException: ``LLM_PARAM_INVALID`` (not cache-manager mode, a name, member count, rank order or rank
                table the checks refuse), ``LLM_TIMEOUT`` (the members did not all join in time), ``LLM_LINK_FAILED``.
        """
        self._check_init()
        v.check_isinstance("comm_name", comm_name, [str], allow_none=False)
        v.check_dict("cluster_rank_info", cluster_rank_info, int, int)
        v.check_isinstance("rank_table", rank_table, [str], allow_none=False)
        v.raise_if_false(self._enable_cache_manager, "link is only supported in cache manager mode")
        v.raise_if_false(0 < len(comm_name) < 128, "comm_name must be non-empty and shorter than 128 characters")
        v.raise_if_false(2 <= len(cluster_rank_info) <= 4, "cluster_rank_info must have 2 to 4 members")
        ranks = list(cluster_rank_info.values())
        v.raise_if_false(ranks == sorted(ranks), "cluster_rank_info ranks must be in ascending order")
        for cluster, rank in cluster_rank_info.items():
            v.check_uint64("cluster_id", cluster)
            v.check_uint32("rank", rank)
        resp = self._call("Link", datadist_pb2.CommLinkRequest(
            engine_id=self._engine_id, comm_name=comm_name, rank_table=rank_table,
            members=[datadist_pb2.CommMember(cluster_id=c, rank=r) for c, r in cluster_rank_info.items()]), "link")
        self._is_call_linked = True
        return resp.comm_id

    def unlink(self, comm_id: int) -> None:
        """Destroy the comm domain ``comm_id`` (v2).

        Args:
            comm_id: the id ``link`` returned.

        Raises:
            RuntimeError: before ``init`` or after ``finalize`` ("llm datadist is not initialized").
            TypeError, ValueError: an argument of the wrong type or out of its integer range.
            LLMException: the daemon's status when it cannot destroy the domain (``LLM_PARAM_INVALID``: not this
                engine's domain).
        """
        self._check_init()
        v.check_uint64("comm_id", comm_id)
        self._call("Unlink", datadist_pb2.CommRef(engine_id=self._engine_id, comm_id=comm_id), "unlink")

    def query_register_mem_status(self, comm_id: int):  # noqa: ANN201
        """Whether memory registration with comm domain ``comm_id`` is done (v2).

        Args:
            comm_id: the id ``link`` returned.

        Returns:
            ``RegisterMemStatus.OK``, ``PREPARING`` or ``FAILED`` (an unknown value is ``FAILED``).

        Raises:
            RuntimeError: before ``init`` or after ``finalize`` ("llm datadist is not initialized").
            TypeError, ValueError: an argument of the wrong type or out of its integer range.
            LLMException: ``LLM_PARAM_INVALID`` (not this engine's domain).
        """
        self._check_init()
        v.check_uint64("comm_id", comm_id)
        from .llm_types import RegisterMemStatus

        resp = self._call("QueryRegisterMemStatus", datadist_pb2.CommRef(engine_id=self._engine_id, comm_id=comm_id),
                          "query_register_mem_status")
        try:
            return RegisterMemStatus(resp.status)
        except ValueError:
            return RegisterMemStatus.FAILED

    def check_link_status(self, remote_cluster_id: int) -> None:
        """Check the link to ``remote_cluster_id`` end to end (v1, the linking side only).

        Args:
            remote_cluster_id: the linked cluster (uint64).

        Raises:
            RuntimeError: before ``init`` or after ``finalize`` ("llm datadist is not initialized").
            TypeError, ValueError: an argument of the wrong type or out of its integer range.
            LLMException: ``LLM_PARAM_INVALID`` (cache-manager mode), ``LLM_NOT_YET_LINK`` (no such link),
                ``LLM_LINK_FAILED`` or ``LLM_TIMEOUT`` (the other end did not answer within ``sync_kv_timeout``),
                ``LLM_LINK_BUSY`` (a pull holds the link).
        """
        self._check_init()
        v.check_uint64("remote_cluster_id", remote_cluster_id)
        v.raise_if_true(self._enable_cache_manager, "check_link_status is not supported when "
                                                    "llm.EnableCacheManager is configured.")
        timeout_ms = int(self._options.get("llm.SyncKvCacheWaitTime", "1000"))
        self._call("CheckLinkStatus", datadist_pb2.LinkStatusRequest(
            engine_id=self._engine_id, remote_cluster_id=remote_cluster_id, timeout_ms=timeout_ms),
            "check_link_status", timeout_ms / 1000 + RPC_MARGIN_S)

    # ---- managers ------------------------------------------------------------------------------

    @property
    def cache_manager(self):  # noqa: ANN201
        """The ``CacheManager`` (v2, cache-manager mode); ``RuntimeError`` before ``init``,
        ``LLMException(LLM_PARAM_INVALID)`` in v1 mode.
        """
        self._check_init()
        v.raise_if_false(self._enable_cache_manager, "cache_manager is only available in cache manager mode "
                                                     "(enable_cache_manager=True)")
        return self._cache_manager

    @property
    def kv_cache_manager(self):  # noqa: ANN201
        """The ``KvCacheManager`` (v1); ``RuntimeError`` before ``init``,
        ``LLMException(LLM_PARAM_INVALID)`` in cache-manager mode.
        """
        self._check_init()
        v.raise_if_true(self._enable_cache_manager, "kv_cache_manager is not available in cache manager mode")
        return self._kv_cache_manager

    # ---- the model API of CANN 8.0.RC2-8.2 (docs/spec.md §9; see llm_model.py) -------------------------

    def add_model(self, model_options: Dict[str, str], model_runner: Optional["ModelRunner"] = None):  # noqa: ANN201
        """A model whose KV caches this node keeps (the model API, KvCacheManager mode).

        Args:
            model_options: the model's options (``ModelConfig.generate_options()``).
            model_runner: the object that runs the model (the model API's ``ModelRunner``), or None.

        Returns:
            An ``LLMModel``.

        Raises:
            RuntimeError: before ``init`` or after ``finalize`` ("llm datadist is not initialized").
            TypeError: ``model_options`` not a ``dict[str, str]``, ``model_runner`` not a ``ModelRunner``.
            LLMException: ``LLM_PARAM_INVALID`` (cache-manager mode; model options the checks refuse).
        """
        from .llm_model import add_model

        self._check_init()
        return add_model(self, model_options, model_runner)

    def check_capacity(self, seq_len: int):  # noqa: ANN201
        """Whether ``predict`` can allocate KV for ``seq_len`` more tokens (PROMPT, the model API).

        Args:
            seq_len: tokens, >= 0.

        Returns:
            A ``CapacityState``.

        Raises:
            RuntimeError: before ``init`` or after ``finalize`` ("llm datadist is not initialized").
            TypeError, ValueError: an argument of the wrong type or out of its integer range.
            LLMException: ``LLM_PARAM_INVALID`` (not PROMPT, no model added).
        """
        from .llm_model import check_capacity

        self._check_init()
        return check_capacity(self, seq_len)

    def complete_request(self, llm_req: "LLMReq") -> None:
        """Release what a request holds: its unpulled KV (PROMPT) or its staged KV (DECODER).

        Args:
            llm_req: the ``LLMReq`` of the model API.

        Raises:
            RuntimeError: before ``init`` or after ``finalize`` ("llm datadist is not initialized").
            TypeError: ``llm_req`` not an ``LLMReq``.
            LLMException: the status of the call that frees the request's KV (``remove_cache_key``,
                ``deallocate_cache``: ``LLM_PARAM_INVALID``, ...).
        """
        from .llm_model import complete_request

        self._check_init()
        complete_request(self, llm_req)

    @property
    def cluster_id(self) -> int:
        """This node's cluster id, as given to the constructor."""
        return self._cluster_id


def _finalize_at_exit() -> None:
    inst = LLMDataDist.llm_engine_instance
    if inst is not None:
        try:
            inst.finalize()
        except LLMException:
            pass


def _register_exit_finalize() -> None:
    """CANN registers an exit-time finalize (``atexit.register(_shutdown_handler)``); ours must run earlier.

    Plain ``atexit`` hooks run after ``threading._shutdown`` has stopped every ``ThreadPoolExecutor``
    (``concurrent.futures.thread._python_exit``), and an embedded daemon needs its executor to unlink
    and tell the peers. Threading's exit hooks run in reverse order of registration, so ours,
    registered after ``concurrent.futures.thread`` registered its own, runs before it. The ``atexit``
    hook stays as a fallback (finalize is idempotent).
    """
    import concurrent.futures.thread  # noqa: F401 - registers the executors' exit hook first

    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        register(_finalize_at_exit)
    atexit.register(_finalize_at_exit)


_register_exit_finalize()


_ = common_pb2
