"""Parameter checks with CANN's exception types (private).

Three tiers, as in CANN's ``llm_datadist.utils.utils`` and ``status``:

* wrong type -> ``TypeError("{name} only support [...], but got <class ...>.")``;
* integer out of range -> ``ValueError`` (``bool`` is an ``int`` here, as in CANN);
* semantic rule broken -> ``LLMException(status_code=LLM_PARAM_INVALID)`` unless told otherwise.
"""

from __future__ import annotations

from typing import Any, Iterable, NoReturn, Optional, Sequence, Type, Union

from .status import LLMException, LLMStatusCode

__all__ = [
    "UINT8_MAX", "UINT16_MAX", "UINT32_MAX", "UINT64_MAX", "INT32_MIN", "INT32_MAX", "INT64_MIN", "INT64_MAX",
    "check_isinstance", "check_inner", "check_dict",
    "check_uint64", "check_int64", "check_uint32", "check_int32", "check_uint16", "check_uint8",
    "check_list_uint64", "check_list_int64", "check_list_int32", "check_positive_or_set_default",
    "raise_if_false", "raise_if_true", "refuse",
]

UINT8_MAX = 2**8 - 1
UINT16_MAX = 2**16 - 1
UINT32_MAX = 2**32 - 1
UINT64_MAX = 2**64 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

_Types = Union[Type[Any], Sequence[Type[Any]]]


def _as_list(classes: _Types) -> list:
    return list(classes) if isinstance(classes, (list, tuple)) else [classes]


def check_inner(arg_name: str, arg_value: Iterable[Any], inner_class: _Types) -> None:
    """Every element of ``arg_value`` must be an instance of ``inner_class`` (TypeError)."""
    inner = tuple(_as_list(inner_class))
    for item in arg_value:
        if not isinstance(item, inner):
            raise TypeError(f"{arg_name} inner type only support {[c.__name__ for c in inner]}, "
                            f"but got {type(item)}.")


def check_isinstance(arg_name: str, arg_value: Any, classes: _Types, inner_class: Optional[_Types] = None,
                     extra_fmt: str = "", allow_none: bool = True) -> Any:
    """``arg_value`` must be one of ``classes`` (``None`` passes unless ``allow_none=False``).

    With ``inner_class`` the elements of a matching container are checked too.
    """
    if allow_none and arg_value is None:
        return arg_value
    if inner_class is None and type(classes) is list and type(arg_value) in classes:   # the common case, no tuple built
        return arg_value
    classes = _as_list(classes)
    if not isinstance(arg_value, tuple(classes)):
        raise TypeError(f"{extra_fmt}{arg_name} only support {[c.__name__ for c in classes]}, "
                        f"but got {type(arg_value)}.")
    if inner_class is not None:
        check_inner(arg_name, arg_value, inner_class)
    return arg_value


def check_dict(arg_name: str, arg_value: Any, k_class: _Types, v_class: _Types,
               v_inner_class: Optional[_Types] = None, allow_none: bool = True) -> Any:
    """``arg_value`` must be a dict with ``k_class`` keys and ``v_class`` values (TypeError).

    ``None`` passes unless ``allow_none=False`` (CANN crashes with AttributeError there instead).
    """
    check_isinstance(arg_name, arg_value, [dict], allow_none=allow_none)
    if arg_value is None:
        return arg_value
    k_types, v_types = tuple(_as_list(k_class)), tuple(_as_list(v_class))
    for k, val in arg_value.items():
        if not isinstance(k, k_types):
            raise TypeError(f"{arg_name} dict key only support {[c.__name__ for c in k_types]}, but got {type(k)}.")
        if not isinstance(val, v_types):
            raise TypeError(f"{arg_name} dict value only support {[c.__name__ for c in v_types]}, "
                            f"but got {type(val)}.")
        if v_inner_class is not None:
            check_inner(f"{arg_name} dict value", val, v_inner_class)
    return arg_value


def _check_int_range(arg_name: str, arg_value: Any, low: int, high: int, type_name: str) -> int:
    if type(arg_value) is int and low <= arg_value <= high:   # the common case (bool and int subclasses below)
        return arg_value
    check_isinstance(arg_name, arg_value, [int], allow_none=False)
    if arg_value < low or arg_value > high:
        raise ValueError(f"{arg_name}'s value is out of range,{arg_value} is not a {type_name} value.")
    return arg_value


def check_uint64(arg_name: str, arg_value: Any) -> int:
    return _check_int_range(arg_name, arg_value, 0, UINT64_MAX, "uint64")


def check_int64(arg_name: str, arg_value: Any) -> int:
    return _check_int_range(arg_name, arg_value, INT64_MIN, INT64_MAX, "int64")


def check_uint32(arg_name: str, arg_value: Any) -> int:
    return _check_int_range(arg_name, arg_value, 0, UINT32_MAX, "uint32")


def check_int32(arg_name: str, arg_value: Any) -> int:
    return _check_int_range(arg_name, arg_value, INT32_MIN, INT32_MAX, "int32")


def check_uint16(arg_name: str, arg_value: Any) -> int:
    return _check_int_range(arg_name, arg_value, 0, UINT16_MAX, "uint16")


def check_uint8(arg_name: str, arg_value: Any) -> int:
    return _check_int_range(arg_name, arg_value, 0, UINT8_MAX, "uint8")


def check_list_uint64(arg_name: str, arg_value: Iterable[Any]) -> None:
    for item in arg_value:
        check_uint64(arg_name, item)


def check_list_int64(arg_name: str, arg_value: Iterable[Any]) -> None:
    for item in arg_value:
        check_int64(arg_name, item)


def check_list_int32(arg_name: str, arg_value: Iterable[Any]) -> None:
    for item in arg_value:
        check_int32(arg_name, item)


def check_positive_or_set_default(arg_name: str, arg_value: Optional[int], default: int = -1) -> int:
    """``None`` -> ``default``; otherwise an int64 that is ``>= 0`` (ValueError if negative)."""
    if arg_value is None:
        return default
    check_int64(arg_name, arg_value)
    if arg_value < 0:
        raise ValueError(f"{arg_name}'s value:{arg_value} is invalid, should be >= 0")
    return arg_value


def _format(msg: str, args: tuple) -> str:
    return msg.format(*args) if args else msg


def raise_if_false(condition: Any, msg: str, *args: Any,
                   status_code: LLMStatusCode = LLMStatusCode.LLM_PARAM_INVALID) -> None:
    """Raise ``LLMException(msg, status_code=...)`` when ``condition`` is falsy; ``args`` fill ``{}`` in msg."""
    if not condition:
        raise LLMException(_format(msg, args), status_code=status_code)


def raise_if_true(condition: Any, msg: str, *args: Any,
                  status_code: LLMStatusCode = LLMStatusCode.LLM_PARAM_INVALID) -> None:
    """Raise ``LLMException(msg, status_code=...)`` when ``condition`` is truthy; ``args`` fill ``{}`` in msg."""
    if condition:
        raise LLMException(_format(msg, args), status_code=status_code)


def refuse(msg: str, status_code: LLMStatusCode = LLMStatusCode.LLM_PARAM_INVALID) -> NoReturn:
    """A semantic rule broken (the caller tested it inline): ``LLMException`` with ``status_code``."""
    raise LLMException(msg, status_code=status_code)
