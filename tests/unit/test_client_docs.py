"""Nothing public in the Python client goes without a docstring: every name the package exports (``__all__`` and the
v1 names it re-exports lazily), ``CacheManager`` (reached as ``LLMDataDist.cache_manager``), their public methods
and properties -- inherited ones too, wherever in the client they are defined -- and every public class and
function of the package's public modules. ``test_client_docstrings`` checks what the docstrings of the exported
classes' own methods say (Args/Returns/Raises); this one that nothing public is missing one."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from typing import Any, Iterator

import llm_datadist as ld
from llm_datadist.cache_manager import CacheManager


def _exported() -> dict[str, Any]:
    """What ``llm_datadist`` exports, by name: ``__all__``, the lazily re-exported v1 names, and ``CacheManager``."""
    names = [*ld.__all__, *ld._V1_NAMES]
    found = {name: getattr(ld, name) for name in names}   # through the package, as a user reaches them
    found["CacheManager"] = CacheManager
    return found


def _public_modules() -> list[Any]:
    return [importlib.import_module(f"llm_datadist.{info.name}") for info in pkgutil.iter_modules(ld.__path__)
            if not info.name.startswith("_")]


def _has_doc(obj: Any) -> bool:
    return bool((obj.__doc__ or "").strip())


def _members(cls: type) -> Iterator[tuple[str, Any]]:
    """Public methods and properties of ``cls`` and of every base class of the client (not ``object``, ``int``,
    ``Enum``'s own); a name is taken where the MRO finds it first."""
    seen: set[str] = set()
    for base in cls.__mro__:
        if not base.__module__.startswith("llm_datadist"):
            continue
        for name, member in vars(base).items():
            if name.startswith("_") or name in seen:
                continue
            seen.add(name)
            if isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            if isinstance(member, property) or inspect.isfunction(member):
                yield f"{base.__qualname__}.{name}", member


def _undocumented(label: str, obj: Any) -> list[str]:
    missing = [] if _has_doc(obj) else [label]
    if inspect.isclass(obj):
        missing += [f"{label}: {where}" for where, member in _members(obj) if not _has_doc(member)]
    return missing


def test_every_exported_name_and_its_public_members_have_a_docstring() -> None:
    missing = [m for name, obj in sorted(_exported().items()) if inspect.isclass(obj) or inspect.isfunction(obj)
               for m in _undocumented(name, obj)]
    assert not missing, "no docstring:\n" + "\n".join(missing)


def test_every_public_class_and_function_of_the_public_modules_has_a_docstring() -> None:
    missing = []
    for module in _public_modules():
        for name, obj in vars(module).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                continue   # private, or imported from elsewhere (checked where it is defined)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                missing += _undocumented(f"{module.__name__}.{name}", obj)
    assert not missing, "no docstring:\n" + "\n".join(missing)


def test_the_walk_sees_what_it_is_about() -> None:
    """The checks above look at the real surface: lazily exported classes, properties, the model API's entry points
    and the enums are among what they walk."""
    exported = _exported()
    assert {"LLMDataDist", "KvCacheManager", "CapacityState", "LLMModel", "LLMRole", "Tensor", "CacheManager"} \
        <= exported.keys()
    walked = {f"{name}: {where}" for name, obj in exported.items() if inspect.isclass(obj)
              for where, _ in _members(obj)}
    assert {"CapacityState: CapacityState.is_available", "LLMModel: LLMModel.pull_kv",
            "CacheManager: CacheManager.pull_blocks", "RegisterMemStatus: RegisterMemStatus.from_int"} <= walked
    modules = {module.__name__ for module in _public_modules()}
    assert {"llm_datadist.llm_model", "llm_datadist.cache_manager", "llm_datadist.views"} <= modules
    assert "llm_datadist._rpc" not in modules
    assert callable(ld.llm_model.check_capacity)
