"""Rooms of the design: which room may import which, only api/ and process/ import grpc, importing datadistd loads
no device library; no daemon function is over 60 lines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

GRPC_FREE = ["datadistd", "datadistd.core.types", "datadistd.core.registry", "datadistd.core.layout",
             "datadistd.core.allocator", "datadistd.core.plan", "datadistd.core.options", "datadistd.engine.engine",
             "datadistd.links", "datadistd.node.node", "datadistd.links.comm", "datadistd.memory",
             "datadistd.memory.host", "datadistd.memory.imported",
             "datadistd.transport", "datadistd.transport.tcp", "datadistd.ops.config"]


def loaded_after(imports: list[str]) -> set[str]:
    code = f"import sys; import {', '.join(imports)}; print('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_domain_imports_no_grpc_and_no_device_library() -> None:
    mods = loaded_after(GRPC_FREE)
    assert not {m for m in mods if m == "grpc" or m.startswith("grpc.")}
    assert not {m for m in mods if m.split(".")[0] in ("acl", "torch", "torch_npu", "hccl", "cupy", "pycuda")}
    assert "datadistd.api.grpc" not in mods


def test_unknown_backend_and_transport_list_the_known_ones() -> None:
    import pytest

    from datadistd.memory import get_backend
    from datadistd.transport import get_transport

    with pytest.raises(ValueError, match="known: acl, host"):
        get_backend("nvme")
    with pytest.raises(ValueError, match="known: hccl, nixl, tcp"):
        get_transport("rdma")


def test_device_backends_fail_clearly_without_hardware() -> None:
    import pytest

    from datadist.status import LLMStatusCode
    from datadistd.core.errors import DataDistError
    from datadistd.memory import get_backend

    for name in ("acl",):
        with pytest.raises(DataDistError) as info:
            get_backend(name)
        assert info.value.code == LLMStatusCode.LLM_FEATURE_NOT_ENABLED
        assert "host" in info.value.message


def _import_graph(type_checking: bool = True) -> dict[str, set[str]]:
    """module -> the project modules it imports, anywhere in it (deferred imports inside functions too, which
    hide a cycle rather than break it); with ``type_checking`` the imports under ``if TYPE_CHECKING:`` too
    (a cycle the type checker needs is still a cycle of the design)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    packages = {"datadistd": root / "server" / "datadistd", "llm_datadist": root / "client" / "llm_datadist"}

    def name_of(pkg: str, base: Path, path: Path) -> str:
        parts = [pkg, *path.relative_to(base).with_suffix("").parts]
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    files = {name_of(pkg, base, p): p for pkg, base in packages.items() for p in base.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        here = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        deps: set[str] = set()
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):   # without type_checking, first drop what only the type checker sees
            if not type_checking and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                node.body = [ast.Pass()]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                target = ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else [])) \
                    if node.level else (node.module or "")
                subs = {f"{target}.{a.name}" for a in node.names} & files.keys()
                deps.update(subs or {target})
        graph[mod] = {d for d in deps if d in files and d != mod}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    cycles: list[list[str]] = []
    seen: list[str] = []
    done: set[str] = set()

    def visit(mod: str) -> None:
        seen.append(mod)
        for dep in sorted(graph[mod]):
            if dep in seen:
                cycles.append(seen[seen.index(dep):] + [dep])
            elif dep not in done:
                visit(dep)
        seen.pop()
        done.add(mod)

    for mod in sorted(graph):
        if mod not in done:
            visit(mod)
    return cycles


def test_no_import_cycles() -> None:
    """No module imports, even lazily or only for the type checker (``if TYPE_CHECKING:``), a module that
    imports it back (the architecture issue, issue 26): a cycle the type checker needs is still a cycle of
    the design. Where a lower module needs something of a higher one it declares a small Protocol."""
    run_time = _import_graph(type_checking=False)
    assert len(run_time) > 50 and run_time["datadistd.links"], "the graph was not read"
    cycles = _cycles(run_time)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)
    typed = _cycles(_import_graph())
    assert not typed, "import cycles (with TYPE_CHECKING imports): " + "; ".join(" -> ".join(c) for c in typed)


#: the daemon's rooms, bottom to top (docs/daemon.md, "Layout"), and the rooms each may import besides its own:
#: only rooms listed before it, so no module calls up. ``datadistd`` itself (``__version__``) anyone may import.
ROOMS: dict[str, set[str]] = {
    "core": set(),                                   # the domain's records and rules: pure
    "memory": {"core"},
    "guard": {"core"},                               # admission, authorization, quotas, the fair executor
    "transport": {"core", "memory", "guard"},        # data-plane channels; the data port's admission
    "engine": {"core", "memory", "guard"},           # an engine: its registry and memory, the views of its rows
    "ops": {"core", "memory", "guard", "transport"},   # what the operator sets and reads: config, secret, metrics
    "links.wire": {"core"},                          # what two daemons say: records and frames only
    "links": {"core", "memory", "guard", "transport", "engine", "ops", "links.wire"},
    "node": {"core", "memory", "guard", "transport", "engine", "ops", "links.wire", "links"},
    "api": {"core", "memory", "guard", "transport", "engine", "ops", "links.wire", "links", "node"},
    "api.grpc": {"core", "memory", "guard", "transport", "engine", "ops", "links.wire", "links", "node", "api"},
    # the attach socket shares the transfer entry (api/transfers.py) with the gRPC services, not their room
    "api.attach": {"core", "memory", "guard", "transport", "engine", "ops", "links.wire", "links", "node", "api"},
    "process": {"core", "memory", "guard", "transport", "engine", "ops", "links.wire", "links", "node", "api",
                "api.grpc", "api.attach"},
    "tools": set(),                                  # make proto: imports nothing of the daemon
}
#: the rooms that may import grpc: the gRPC services and the process that serves them (and ``make proto``)
GRPC_ROOMS = {"api.grpc", "api.attach", "process", "tools"}


def _room(mod: str) -> str:
    """``datadistd.links.wire.peering`` -> ``links.wire``; ``datadistd.api.orders`` -> ``api``."""
    parts = mod.split(".")[1:]
    if parts[:2] in (["links", "wire"], ["api", "grpc"], ["api", "attach"]):
        return ".".join(parts[:2])
    return "process" if parts == ["__main__"] else parts[0]


def test_the_top_level_holds_only_the_package_and_its_main() -> None:
    """Every module of the daemon lives in a room; the top level is the package and ``python -m datadistd``."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "server" / "datadistd"
    assert sorted(p.name for p in root.glob("*.py")) == ["__init__.py", "__main__.py"]
    rooms = {p.name for p in root.iterdir() if (p / "__init__.py").exists()}
    assert rooms == {r.split(".")[0] for r in ROOMS}


def test_the_rooms_form_a_ladder() -> None:
    """A room may import only rooms listed before it in ``ROOMS``: none calls up."""
    order = list(ROOMS)
    for i, room in enumerate(order):
        assert ROOMS[room] <= set(order[:i]), f"{room} may import a room above it: {ROOMS[room] - set(order[:i])}"


def test_no_module_imports_a_room_above_its_own() -> None:
    """Every import of the daemon, deferred and ``TYPE_CHECKING`` ones included, stays in its room or goes down."""
    graph = {mod: deps for mod, deps in _import_graph().items() if mod.startswith("datadistd.")}
    assert len(graph) > 80 and graph["datadistd.node.node"], "the graph was not read"
    up = sorted(f"{mod} -> {dep}" for mod, deps in graph.items() for dep in deps
                if dep.startswith("datadistd.") and _room(dep) != _room(mod) and _room(dep) not in ROOMS[_room(mod)])
    assert not up, "imports of a room above: " + "; ".join(up)


def test_only_the_api_and_the_process_import_grpc() -> None:
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "server"
    found = set()
    for path in (root / "datadistd").rglob("*.py"):
        mod = ".".join(path.relative_to(root).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            if any(n.split(".")[0] == "grpc" or n.startswith("grpc_") for n in names):
                found.add(_room(mod.removesuffix(".__init__")))
    assert found and found <= GRPC_ROOMS, f"grpc imported in {sorted(found - GRPC_ROOMS)}"


#: the most lines a function or method of the daemon may have, from its ``def`` to its last line, its docstring not
#: counted (comments and blank lines are): past it, split it along its steps. A file is as long as its one job needs.
MAX_FUNCTION_LINES = 60

#: functions over the cap whose files are being rewritten: each leaves this list when it is split, and the test fails
#: while one here fits the cap or no longer exists, so the list only shrinks (it is empty: every function fits)
_LONG_FUNCTIONS_BEING_SPLIT: set[tuple[str, str]] = set()


def function_lengths(root: Path) -> dict[tuple[str, str], int]:
    """``{(file under root, function name): lines}`` of every function and method (nested ones too, and each
    counted in the function around it as well), the longest where a file has two of one name."""
    import ast

    lengths: dict[tuple[str, str], int] = {}
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            assert node.end_lineno is not None
            lines = node.end_lineno - node.lineno + 1
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                assert first.end_lineno is not None
                lines -= first.end_lineno - first.lineno + 1
            key = (path.relative_to(root).as_posix(), node.name)
            lengths[key] = max(lines, lengths.get(key, 0))
    return lengths


def test_no_daemon_function_is_over_60_lines() -> None:
    lengths = function_lengths(Path(__file__).resolve().parents[2] / "server" / "datadistd")
    assert len(lengths) > 500, "nothing was read"
    over = {key: n for key, n in lengths.items() if n > MAX_FUNCTION_LINES}
    new = {key: n for key, n in over.items() if key not in _LONG_FUNCTIONS_BEING_SPLIT}
    assert not new, f"functions over {MAX_FUNCTION_LINES} lines (docstrings not counted): {new}; split them"
    done = {key: lengths.get(key) for key in _LONG_FUNCTIONS_BEING_SPLIT if key not in over}
    assert not done, f"split or gone (lines now: {done}): take them out of _LONG_FUNCTIONS_BEING_SPLIT"


def test_the_function_count_skips_the_docstring_only(tmp_path) -> None:
    """The counting rule on a known file: ``def`` to the last line, minus the docstring's lines."""
    (tmp_path / "m.py").write_text('''
def f(x):
    """One
    docstring."""
    # a comment

    return x


class C:
    async def g(self):
        def h():
            return 1
        return h()
''')
    assert function_lengths(tmp_path) == {("m.py", "f"): 4, ("m.py", "g"): 4, ("m.py", "h"): 2}


#: the only ``getattr``/``hasattr`` in the daemon, by file and the object asked: feature probes of the standard
#: library, generated protobuf/grpc objects, configuration reflection and plugin loading. Our own types
#: declare what they can do (Protocols, ``runtime_checkable`` capabilities checked with ``isinstance``).
REFLECTION_ALLOWED = {
    ("process/cli.py", "logging"), ("ops/config.py", "self"), ("ops/config.py", "cfg"),
    ("ops/config.py", "cfg.tls"), ("process/ctl.py", "stub"),
    ("core/plugins.py", "importlib.import_module(module_name)"), ("api/attach.py", "socket"),
    ("api/grpc/server.py", "request"), ("api/grpc/server.py", "servicer"),
    ("transport/tcp/staging.py", "self._local"),
    ("transport/tcp/wire.py", "socket"),
    ("memory/host.py", "mmap"), ("memory/host.py", "os"), ("memory/addr.py", "mmap"),
}


def test_the_daemon_probes_none_of_its_own_types() -> None:
    """No ``getattr``/``hasattr`` on the project's own types in the daemon (the architecture issue)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "server" / "datadistd"
    found = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr") and node.args):
                found.add((path.relative_to(root).as_posix(), ast.unparse(node.args[0])))
    assert len(found) > 5, "nothing was read"
    assert found <= REFLECTION_ALLOWED, f"reflection on: {sorted(found - REFLECTION_ALLOWED)}"
