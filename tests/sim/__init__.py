"""The SIMULATED Ascend runtime tests run against (no NPU here): ``build()`` compiles ``ascendcl.c`` and
``hccl.c`` with the system C compiler into ``<root>/lib64/libascendcl.so`` and ``libhccl.so``, with the
header ``<root>/include/acl/acl.h`` declaring what it exports -- a tree laid out like ``$ASCEND_HOME_PATH``,
so daemons and workers load it exactly as they would load CANN's (and C++ code built for an NPU builds). What the
simulation checks and what it cannot: ``docs/ascend.md``."""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

__all__ = ["build", "sim_env", "write_hccn_conf", "open_export_keys", "transports", "SOURCES"]

HERE = Path(__file__).resolve().parent
SOURCES = ("sim.h", "ascendcl.c", "hccl.c", "acl_errmsg.c", "include/acl/acl.h", "hccn_tool")


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def build(root: Path | None = None) -> Path | None:
    """The simulated ``ASCEND_HOME_PATH`` (built once per source version, reused after); ``None`` without a
    C compiler."""
    cc = _compiler()
    if cc is None:
        return None
    digest = hashlib.sha256(b"".join((HERE / s).read_bytes() for s in SOURCES)).hexdigest()[:16]
    root = root or Path(tempfile.gettempdir()) / f"datadist-ascend-sim-{os.getuid()}-{digest}"
    lib = root / "lib64"
    if (lib / "libhccl.so").exists():
        return root
    work = Path(tempfile.mkdtemp(prefix="ascend-sim-build-", dir=root.parent))
    try:
        (work / "lib64").mkdir()
        flags = ["-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-pthread"]
        subprocess.run([cc, *flags, "-o", str(work / "lib64" / "libascendcl.so"), str(HERE / "ascendcl.c"),
                        str(HERE / "acl_errmsg.c")], check=True, capture_output=True, timeout=120)
        # the header C/C++ code written for an NPU includes (acl/acl.h), declaring what the library exports
        shutil.copytree(HERE / "include", work / "include")
        (work / "bin").mkdir()   # the node's hccn_tool, answering from ASCEND_SIM_HCCN_CONF as the real one does
        shutil.copy(HERE / "hccn_tool", work / "bin" / "hccn_tool")
        (work / "bin" / "hccn_tool").chmod(0o755)
        subprocess.run([cc, *flags, "-o", str(work / "lib64" / "libhccl.so"), str(HERE / "hccl.c"),
                        f"-L{work / 'lib64'}", "-lascendcl", "-Wl,-rpath,$ORIGIN"],
                       check=True, capture_output=True, timeout=120)
        try:
            work.rename(root)
        except OSError:   # another process built it meanwhile
            shutil.rmtree(work, ignore_errors=True)
    except subprocess.CalledProcessError as exc:
        shutil.rmtree(work, ignore_errors=True)
        raise RuntimeError(f"building the simulated Ascend runtime failed:\n{exc.stderr.decode()}") from None
    return root


def write_hccn_conf(path: Path | str, subnet: int = 100, devices: int = 8) -> str:
    """An ``/etc/hccn.conf`` of a simulated server (``address_<physical id>=192.168.<subnet>.<101 + id>``, real
    looking NIC addresses, one subnet per server); its path."""
    lines = [f"address_{i}=192.168.{subnet}.{101 + i}\nnetmask_{i}=255.255.255.0\n" for i in range(devices)]
    Path(path).write_text("".join(lines))
    return str(path)


def sim_env(root: Path, state_dir: str, subnet: int = 100) -> dict[str, str]:
    """Environment of a process that uses the simulated runtime: CANN's variable, where its memory lives, and the
    node it runs on -- eight NPUs whose NIC addresses are in a generated hccn.conf (``write_hccn_conf``; a daemon
    reads it as it would read ``/etc/hccn.conf``, ``[transport] hccl_hccn_conf``)."""
    conf = Path(state_dir) / f"hccn-{subnet}.conf"
    if not conf.exists():
        write_hccn_conf(conf, subnet)
    return {"ASCEND_HOME_PATH": str(root), "ASCEND_SIM_DIR": state_dir, "ASCEND_SIM_HCCN_CONF": str(conf),
            "DATADISTD_TRANSPORT_HCCL_HCCN_CONF": str(conf),
            "DATADISTD_TRANSPORT_HCCL_HCCN_TOOL": str(Path(root) / "bin" / "hccn_tool")}


def open_export_keys(state_dir: str, pid: int) -> list[str]:
    """The IPC export keys process ``pid`` made (``aclrtIpcMemGetExportKey``) and has not closed: the simulation
    keeps each as ``<state_dir>/ipc-k<exporter pid>-...`` until its exporter closes it (``ascendcl.c``)."""
    return sorted(p.name[len("ipc-"):] for p in Path(state_dir).glob(f"ipc-k{pid}-*") if not p.name.endswith(".tmp"))


#: hccl.c pub_head: pid, prepared, count, traffic class, service level, device, instance id, hccs and roce peers
_PUB_HEAD = struct.Struct("=iiIIIiQII")


def transports(state_dir: str, pid: int | None = None) -> dict[str, str]:
    """The transport each live communicator's Prepare chose (hccl.c R27, as hcomm's ``IsUsedRdma``), by its file
    ``comm-<name>-r<rank>``: ``"hccs"``, ``"roce"``, ``"both"``, or ``""`` before its Prepare; of process ``pid``
    only when given."""
    out = {}
    for path in sorted(Path(state_dir).glob("comm-*-r*")):
        try:
            owner, *_, hccs, roce = _PUB_HEAD.unpack_from(path.read_bytes())
        except (OSError, struct.error):   # destroyed (or being replaced) as it was read
            continue
        if not path.name.endswith(".tmp") and pid in (None, owner):
            out[path.name] = "both" if hccs and roce else "hccs" if hccs else "roce" if roce else ""
    return out
