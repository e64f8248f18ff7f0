"""Every public method of the CANN-compatible client says what it takes, returns and raises (its docstring:
``Args:``, ``Returns:``, ``Raises:`` naming the ``LLMStatusCode`` of an ``LLMException``), and every public
property says what it holds -- the model API's classes too (``llm_model``: importable, not in ``__all__``, as in
CANN)."""

from __future__ import annotations

import inspect
from typing import Any, Iterator

import llm_datadist as ld
from llm_datadist import llm_model
from llm_datadist.cache_manager import CacheManager


def _public() -> dict[str, type]:
    names = {name: getattr(ld, name) for name in ld.__all__}
    names["CacheManager"] = CacheManager
    names.update((name, getattr(ld, name)) for name in llm_model.__all__)   # through the package, as a user does
    return {name: cls for name, cls in names.items() if inspect.isclass(cls)}


def _members(cls: type) -> Iterator[tuple[str, Any]]:
    for name, member in vars(cls).items():
        if name.startswith("_") and name != "__init__":
            continue
        if isinstance(member, (staticmethod, classmethod)):
            member = member.__func__
        if isinstance(member, property) or inspect.isfunction(member):
            yield name, member


def _problems(cls_name: str, name: str, member: Any) -> list[str]:
    where = f"{cls_name}.{name}"
    if isinstance(member, property):
        return [] if (member.__doc__ or "").strip() else [f"{where}: a property without a docstring"]
    doc = inspect.getdoc(member) or ""
    if not doc:
        return [f"{where}: no docstring"]
    sig = inspect.signature(member)
    args = [p for p in sig.parameters if p not in ("self", "cls")]
    found = []
    if args and "Args:" not in doc:
        found.append(f"{where}: no Args: for {args}")
    returns = sig.return_annotation
    if name != "__init__" and returns not in (None, "None") and "Returns:" not in doc:
        found.append(f"{where}: no Returns:")
    if args and name != "__init__" and "Raises:" not in doc:   # every argument is checked: what a bad one raises
        found.append(f"{where}: no Raises:")
    if "Raises:" in doc and "LLMException" in doc.split("Raises:", 1)[1] and "LLM_" not in doc.split("Raises:")[1]:
        found.append(f"{where}: raises LLMException without naming its LLMStatusCode")
    return found


def test_every_public_method_of_the_client_has_args_returns_and_raises() -> None:
    problems = [p for cls_name, cls in sorted(_public().items()) for name, member in _members(cls)
                for p in _problems(cls_name, name, member)]
    assert not problems, "\n".join(problems)


def test_the_check_sees_the_methods_it_is_about() -> None:
    """The test above looks at the real surface: the transfer methods of both managers are among them."""
    seen = {f"{c}.{n}" for c, cls in _public().items() for n, _ in _members(cls)}
    assert {"CacheManager.pull_blocks", "KvCacheManager.pull_blocks", "LLMDataDist.link_clusters",
            "CacheTask.synchronize", "CacheKey.req_id", "LLMModel.pull_kv", "CapacityState.is_available",
            "ModelConfig.generate_options", "ModelRunner.run_model", "LLMReq.__init__"} <= seen
    assert len(seen) > 150
