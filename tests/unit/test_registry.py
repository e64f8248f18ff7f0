"""``CacheRegistry``: key tables and reference counts (spec §7, §10.2), unit rules and a state machine."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from datadistd.core.errors import DataDistError, StatusCode
from datadistd.core.registry import CacheEntry, CacheRegistry
from datadistd.core.types import UINT64_MAX, CacheDesc, CacheId, DType, KeyKind, OwnerKey

INVALID = StatusCode.LLM_PARAM_INVALID
NOT_EXIST = StatusCode.LLM_KV_CACHE_NOT_EXIST


def desc(rows: int = 4, tensors: int = 2) -> CacheDesc:
    return CacheDesc(num_tensors=tensors, shape=(rows, 8), dtype=DType.DT_FLOAT16)


def req(ident: int, model: int = 0) -> OwnerKey:
    return OwnerKey(KeyKind.REQ, ident, model)


def prefix(ident: int, model: int = 0) -> OwnerKey:
    return OwnerKey(KeyKind.PREFIX, ident, model)


def code_of(fn, *args, **kwargs) -> StatusCode:  # noqa: ANN001
    with pytest.raises(DataDistError) as exc:
        fn(*args, **kwargs)
    return exc.value.code


def allocate(reg: CacheRegistry, d: CacheDesc | None = None, keys=(),  # noqa: ANN001
             memory: object = None) -> CacheEntry:
    d = d or desc()
    reg.check_allocate_keys(d, list(keys))
    entry = reg.add(d, is_blocks=False, owned=True, remote_accessible=True, memory=memory)
    reg.bind_keys(entry.cache_id, list(keys))
    return entry


def register(reg: CacheRegistry, d: CacheDesc | None = None, keys=()) -> CacheEntry:  # noqa: ANN001
    entry = reg.add(d or desc(), is_blocks=False, owned=False, remote_accessible=True, memory=None)
    reg.bind_keys(entry.cache_id, list(keys))
    return entry


def blocks(reg: CacheRegistry, *, owned: bool, model_id: int | None = None, overwrite: bool = False) -> CacheEntry:
    entry = reg.add(desc(rows=16), is_blocks=True, owned=owned, remote_accessible=True, memory=None)
    if model_id is not None:
        reg.bind_blocks_key(entry.cache_id, model_id, overwrite=overwrite)
    return entry


# ---- ids and entries -----------------------------------------------------------------------------

def test_cache_ids_count_from_one_per_registry_shared_by_allocate_and_register() -> None:
    a, b = CacheRegistry(), CacheRegistry()
    assert [allocate(a).cache_id, register(a).cache_id, blocks(a, owned=True).cache_id] == [1, 2, 3]
    assert allocate(b).cache_id == 1


def test_ids_are_never_reused() -> None:
    reg = CacheRegistry()
    first = allocate(reg)
    assert reg.release_id(first.cache_id) == [first]
    assert allocate(reg).cache_id == 2


def test_get_find_entries() -> None:
    reg = CacheRegistry()
    e = register(reg)
    assert reg.get(e.cache_id) is e and reg.find(e.cache_id) is e
    assert reg.entries() == [e]
    assert reg.find(CacheId(9)) is None
    assert code_of(reg.get, CacheId(9)) == NOT_EXIST


def test_bytes_owned_counts_pool_caches_only() -> None:
    reg = CacheRegistry()
    a = allocate(reg, desc(rows=4, tensors=2))
    register(reg, desc(rows=8))
    b = blocks(reg, owned=True)
    assert reg.bytes_owned == a.desc.total_size + b.desc.total_size
    reg.release_id(a.cache_id)
    assert reg.bytes_owned == b.desc.total_size


# ---- allocate-path key checks --------------------------------------------------------------------

def test_allocate_keys_more_than_batch_size_is_param_invalid() -> None:
    reg = CacheRegistry()
    assert code_of(reg.check_allocate_keys, desc(rows=2), [req(1), req(2), req(3)]) == INVALID


def test_allocate_key_already_bound_anywhere_is_param_invalid() -> None:
    reg = CacheRegistry()
    first = allocate(reg, keys=[req(1)])
    with pytest.raises(DataDistError) as exc:
        reg.check_allocate_keys(desc(), [None, req(1)])
    assert exc.value.code == INVALID and f"cache {first.cache_id}" in exc.value.message
    register(reg, keys=[prefix(7)])
    assert code_of(reg.check_allocate_keys, desc(), [prefix(7)]) == INVALID


def test_duplicate_keys_in_one_allocate_are_param_invalid() -> None:
    reg = CacheRegistry()
    assert code_of(reg.check_allocate_keys, desc(), [req(1), req(2), req(1)]) == INVALID
    assert code_of(reg.check_allocate_keys, desc(), [prefix(3), prefix(3)]) == INVALID


def test_same_ident_different_model_or_kind_are_different_keys() -> None:
    reg = CacheRegistry()
    allocate(reg, keys=[req(1, 0), req(1, 1), prefix(1, 0)])


def test_placeholders_skip_slots_are_not_stored_and_not_duplicate_checked() -> None:
    reg = CacheRegistry()
    e = allocate(reg, desc(rows=4), keys=[None, None, None, req(3)])
    assert reg.keys_of(e.cache_id) == [req(3)]
    assert reg.lookup(req(3)) == (e, 3)
    assert reg.lookup_by_id(e.cache_id, 0) == (e, None)
    assert reg.lookup_by_id(e.cache_id, 3) == (e, req(3))


def test_blocks_keys_are_not_cache_keys() -> None:
    reg = CacheRegistry()
    assert code_of(reg.check_allocate_keys, desc(), [OwnerKey.blocks(0)]) == INVALID
    e = register(reg)
    assert code_of(reg.bind_keys, e.cache_id, [OwnerKey.blocks(0)]) == INVALID
    assert reg.keys_of(e.cache_id) == []


def test_bind_keys_checks_the_cache() -> None:
    reg = CacheRegistry()
    b = blocks(reg, owned=False)
    assert code_of(reg.bind_keys, b.cache_id, [req(1)]) == INVALID
    e = register(reg, desc(rows=1))
    assert code_of(reg.bind_keys, e.cache_id, [req(1), req(2)]) == INVALID
    assert code_of(reg.bind_keys, CacheId(99), [req(1)]) == NOT_EXIST
    assert reg.keys_of(e.cache_id) == []


# ---- register-path emplace / overwrite -----------------------------------------------------------

def test_register_keeps_the_first_binding_of_a_contiguous_key() -> None:
    reg = CacheRegistry()
    first = register(reg, keys=[req(1), req(2)])
    second = register(reg, keys=[req(2), req(1), req(5)])
    assert reg.lookup(req(1)) == (first, 0)
    assert reg.lookup(req(2)) == (first, 1)
    assert reg.lookup(req(5)) == (second, 2)
    assert reg.keys_of(second.cache_id) == [req(5)]
    assert reg.lookup_by_id(second.cache_id, 0) == (second, None)


def test_register_duplicate_in_one_call_keeps_the_first_slot() -> None:
    reg = CacheRegistry()
    e = register(reg, keys=[req(1), req(1)])
    assert reg.lookup(req(1)) == (e, 0)
    assert reg.lookup_by_id(e.cache_id, 1) == (e, None)


def test_allocate_blocks_key_already_bound_is_param_invalid() -> None:
    reg = CacheRegistry()
    first = blocks(reg, owned=True, model_id=0)
    second = blocks(reg, owned=True)
    assert code_of(reg.bind_blocks_key, second.cache_id, 0, overwrite=False) == INVALID
    assert reg.lookup(OwnerKey.blocks(0)) == (first, 0)
    reg.bind_blocks_key(second.cache_id, 1, overwrite=False)
    reg.bind_blocks_key(second.cache_id, 1, overwrite=False)   # same cache again: fine
    assert reg.lookup(OwnerKey.blocks(1)) == (second, 0)


def test_register_blocks_key_repoints_to_the_newest_cache() -> None:
    reg = CacheRegistry()
    first = blocks(reg, owned=False, model_id=0, overwrite=True)
    second = blocks(reg, owned=False, model_id=0, overwrite=True)
    assert reg.lookup(OwnerKey.blocks(0)) == (second, 0)
    assert reg.keys_of(first.cache_id) == [] and reg.keys_of(second.cache_id) == [OwnerKey.blocks(0)]
    assert reg.find(first.cache_id) is first
    assert reg.remove_cache(first.cache_id) == [first]
    assert reg.lookup(OwnerKey.blocks(0)) == (second, 0)


def test_blocks_key_only_on_blocks_caches() -> None:
    reg = CacheRegistry()
    e = allocate(reg)
    assert code_of(reg.bind_blocks_key, e.cache_id, 0, overwrite=True) == INVALID
    assert code_of(reg.bind_blocks_key, CacheId(42), 0, overwrite=True) == NOT_EXIST


# ---- lookups -------------------------------------------------------------------------------------

def test_unknown_key_is_kv_cache_not_exist() -> None:
    reg = CacheRegistry()
    assert code_of(reg.lookup, req(1)) == NOT_EXIST
    assert code_of(reg.lookup, OwnerKey.blocks(0)) == NOT_EXIST


@pytest.mark.parametrize("batch", [-1, 4, 10])
def test_lookup_by_id_batch_out_of_range_is_kv_cache_not_exist(batch: int) -> None:
    reg = CacheRegistry()
    e = allocate(reg, desc(rows=4))
    assert code_of(reg.lookup_by_id, e.cache_id, batch) == NOT_EXIST
    assert code_of(reg.lookup_by_id, CacheId(77), 0) == NOT_EXIST


def test_lookup_by_id_of_a_blocks_cache_has_no_key() -> None:
    reg = CacheRegistry()
    b = blocks(reg, owned=True, model_id=3)
    assert reg.lookup_by_id(b.cache_id, 0) == (b, None)


# ---- reference counts of allocated caches --------------------------------------------------------

def test_deallocate_without_keys_frees_at_once_and_only_once() -> None:
    reg = CacheRegistry()
    e = allocate(reg)
    assert reg.release_id(e.cache_id) == [e]
    assert reg.find(e.cache_id) is None and reg.entries() == []
    assert reg.release_id(e.cache_id) == []
    assert reg.remove_cache(e.cache_id) == []


def test_deallocate_is_deferred_while_keys_remain() -> None:
    reg = CacheRegistry()
    e = allocate(reg, keys=[req(1), prefix(2)])
    assert reg.release_id(e.cache_id) == []
    assert not e.id_held
    assert reg.lookup(req(1)) == (e, 0)        # still pullable
    assert reg.release_id(e.cache_id) == []    # already released: no-op
    assert reg.remove_key(req(1)) == []
    assert reg.remove_key(prefix(2)) == [e]
    assert reg.find(e.cache_id) is None
    assert reg.bytes_owned == 0


def test_removing_every_key_keeps_the_cache_while_its_id_is_held() -> None:
    reg = CacheRegistry()
    e = allocate(reg, keys=[req(1)])
    assert reg.remove_key(req(1)) == []
    assert reg.get(e.cache_id) is e
    assert code_of(reg.lookup, req(1)) == NOT_EXIST
    assert reg.release_id(e.cache_id) == [e]


def test_remove_missing_key_is_a_no_op() -> None:
    reg = CacheRegistry()
    assert reg.remove_key(req(5)) == []


def test_deallocate_of_unknown_or_registered_cache_is_a_no_op() -> None:
    reg = CacheRegistry()
    assert reg.release_id(CacheId(3)) == []
    r = register(reg, keys=[req(1)])
    assert reg.release_id(r.cache_id) == []
    assert r.id_held and reg.get(r.cache_id) is r


def test_deallocate_of_a_blocks_cache_is_param_invalid() -> None:
    reg = CacheRegistry()
    b = blocks(reg, owned=True)
    assert code_of(reg.release_id, b.cache_id) == INVALID
    assert reg.get(b.cache_id) is b


def test_registered_caches_ignore_remove_cache_key() -> None:
    reg = CacheRegistry()
    r = register(reg, keys=[req(1)])
    assert reg.remove_key(req(1)) == []
    assert reg.lookup(req(1)) == (r, 0)


def test_remove_cache_drops_the_entry_and_every_key() -> None:
    reg = CacheRegistry()
    r = register(reg, keys=[req(1), prefix(1)])
    b = blocks(reg, owned=True, model_id=2)
    assert reg.remove_cache(r.cache_id) == [r]
    assert reg.remove_cache(b.cache_id) == [b]
    for key in (req(1), prefix(1), OwnerKey.blocks(2)):
        assert code_of(reg.lookup, key) == NOT_EXIST
    assert reg.remove_cache(r.cache_id) == []
    assert reg.remove_cache(CacheId(50)) == []
    assert reg.entries() == [] and reg.bytes_owned == 0
    # a freed key can be bound again
    allocate(reg, keys=[req(1)])


# ---- consumption by remote pulls -----------------------------------------------------------------

def test_pull_consumes_a_req_key_of_an_allocated_cache() -> None:
    reg = CacheRegistry()
    e = allocate(reg, desc(tensors=2), keys=[req(1), req(2)])
    assert reg.consume_pulled(req(1), range(2)) == []
    assert code_of(reg.lookup, req(1)) == NOT_EXIST
    assert reg.lookup(req(2)) == (e, 1)
    reg.release_id(e.cache_id)
    assert reg.consume_pulled(req(2), [0, 1]) == [e]


def test_layer_wise_pulls_consume_the_key_after_every_tensor() -> None:
    reg = CacheRegistry()
    e = allocate(reg, desc(tensors=6), keys=[req(1)])
    reg.release_id(e.cache_id)
    assert reg.consume_pulled(req(1), [0, 1]) == []
    assert reg.consume_pulled(req(1), [0, 1]) == []    # repeated layers do not count twice
    assert reg.consume_pulled(req(1), range(4, 6)) == []
    assert reg.lookup(req(1)) == (e, 0)
    assert reg.consume_pulled(req(1), [2, 3]) == [e]
    assert reg.consume_pulled(req(1), [0, 1]) == []


def test_a_huge_tensor_range_is_refused_at_its_first_bad_index() -> None:
    """A peer's Release of ``tensor_count`` 2**32 - 1 names a range of four billion indices: it is refused at the
    first index out of range, never materialised (it held the owner's event loop for minutes)."""
    reg = CacheRegistry()
    allocate(reg, desc(tensors=4), keys=[req(1)])
    taken = []

    def indices():   # as range(0, 2**32 - 1), but it tells how far it was read
        for t in range(2**32 - 1):
            if len(taken) > 8:
                raise AssertionError(f"read {len(taken)} indices of a range whose fifth is out of range")
            taken.append(t)
            yield t

    with pytest.raises(DataDistError) as info:
        reg.consume_pulled(req(1), indices())
    assert info.value.code == StatusCode.LLM_PARAM_INVALID and "pulled tensor index 4 out of range [0, 4)" in str(
        info.value.message)
    assert len(taken) == 5
    with pytest.raises(DataDistError):   # a range itself, as the engine passes it
        reg.consume_pulled(req(1), range(0, 2**32 - 1))


def test_progress_is_forgotten_when_a_key_is_removed_and_bound_again() -> None:
    reg = CacheRegistry()
    a = allocate(reg, desc(tensors=4), keys=[req(1)])
    reg.consume_pulled(req(1), [0, 1])
    reg.remove_key(req(1))
    b = allocate(reg, desc(tensors=4), keys=[req(1)])
    assert reg.consume_pulled(req(1), [2, 3]) == []
    assert reg.lookup(req(1)) == (b, 0)
    del a


def test_pull_never_consumes_prefix_blocks_or_registered_keys() -> None:
    reg = CacheRegistry()
    e = allocate(reg, desc(tensors=1), keys=[prefix(1)])
    r = register(reg, desc(tensors=1), keys=[req(2)])
    b = blocks(reg, owned=True, model_id=0)
    reg.release_id(e.cache_id)
    assert reg.consume_pulled(prefix(1), [0]) == []
    assert reg.consume_pulled(req(2), [0]) == []
    assert reg.consume_pulled(OwnerKey.blocks(0), range(2)) == []
    assert reg.lookup(prefix(1)) == (e, 0)
    assert reg.lookup(req(2)) == (r, 0)
    assert reg.lookup(OwnerKey.blocks(0)) == (b, 0)
    assert reg.consume_pulled(req(9), [0]) == []


def test_consume_with_a_bad_tensor_index_is_param_invalid_without_side_effects() -> None:
    reg = CacheRegistry()
    allocate(reg, desc(tensors=2), keys=[req(1)])
    assert code_of(reg.consume_pulled, req(1), [0, 2]) == INVALID
    assert reg.consume_pulled(req(1), [1]) == []     # 0 was not recorded
    assert reg.lookup(req(1))[1] == 0


# ---- pins ---------------------------------------------------------------------------------------

def test_pins_keep_memory_alive_past_the_last_reference() -> None:
    reg = CacheRegistry()
    e = allocate(reg, keys=[req(1)])
    assert reg.pin(e.cache_id) is e
    reg.pin(e.cache_id)
    reg.release_id(e.cache_id)
    assert reg.consume_pulled(req(1), range(2)) == []
    assert reg.find(e.cache_id) is None            # no longer addressable...
    assert reg.bytes_owned == e.desc.total_size    # ...but its memory is still held
    assert code_of(reg.pin, e.cache_id) == NOT_EXIST
    assert reg.unpin(e.cache_id) == []
    assert reg.unpin(e.cache_id) == [e]
    assert reg.unpin(e.cache_id) == []             # gone: no-op
    assert reg.bytes_owned == 0


def test_remove_cache_while_pinned_frees_on_the_last_unpin() -> None:
    reg = CacheRegistry()
    r = register(reg, keys=[req(1)])
    reg.pin(r.cache_id)
    assert reg.remove_cache(r.cache_id) == []
    assert code_of(reg.lookup, req(1)) == NOT_EXIST
    assert reg.entries() == []
    assert reg.remove_cache(r.cache_id) == []
    assert reg.unpin(r.cache_id) == [r]


def test_unpin_of_a_live_cache_frees_nothing() -> None:
    reg = CacheRegistry()
    e = allocate(reg)
    reg.pin(e.cache_id)
    assert reg.unpin(e.cache_id) == []
    assert reg.get(e.cache_id) is e


def test_unbalanced_unpin_is_an_error() -> None:
    reg = CacheRegistry()
    e = allocate(reg)
    assert code_of(reg.unpin, e.cache_id) == StatusCode.LLM_FAILED


def test_clear_returns_everything_once() -> None:
    reg = CacheRegistry()
    a = allocate(reg, keys=[req(1)])
    r = register(reg)
    b = blocks(reg, owned=True, model_id=0)
    p = allocate(reg, keys=[req(2)])
    reg.pin(p.cache_id)
    reg.release_id(p.cache_id)
    reg.remove_key(req(2))          # p now only waits for its pin
    out = reg.clear()
    assert sorted(e.cache_id for e in out) == sorted([a.cache_id, r.cache_id, b.cache_id, p.cache_id])
    assert reg.entries() == [] and reg.bytes_owned == 0 and reg.clear() == []
    assert reg.unpin(p.cache_id) == []
    assert code_of(reg.lookup, req(1)) == NOT_EXIST


# ---- state machine against a model ----------------------------------------------------------------

KEYS = [req(i, m) for i in range(3) for m in range(2)] + [prefix(0), prefix(1)]
key_lists = st.lists(st.none() | st.sampled_from(KEYS), max_size=4)


class Model:
    """A plain record of what the registry should hold."""

    def __init__(self, cache_id: int, rows: int, tensors: int, owned: bool, is_blocks: bool, size: int) -> None:
        self.cache_id, self.rows, self.tensors = cache_id, rows, tensors
        self.owned, self.is_blocks, self.size = owned, is_blocks, size
        self.id_held, self.pins, self.dead, self.freed = True, 0, False, False


class RegistryMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.reg = CacheRegistry()
        self.caches: dict[int, Model] = {}
        self.keys: dict[OwnerKey, tuple[int, int]] = {}
        self.pulled: dict[OwnerKey, set[int]] = {}
        self.returned: list[CacheEntry] = []
        self.next_id = 1

    # -- model helpers --

    def _unbind(self, key: OwnerKey) -> None:
        del self.keys[key]
        self.pulled.pop(key, None)

    def _keys_of(self, cache_id: int) -> list[OwnerKey]:
        return [k for k, (c, _) in self.keys.items() if c == cache_id]

    def _kill(self, m: Model) -> None:
        for k in self._keys_of(m.cache_id):
            self._unbind(k)
        m.dead = True
        m.id_held = False

    def _settle(self, m: Model) -> None:
        if m.owned and not m.is_blocks and not m.id_held and not self._keys_of(m.cache_id):
            m.dead = True

    def _apply(self, freed: list[CacheEntry]) -> None:
        """Compare what the registry freed with what the model expects to be freed now."""
        for m in self.caches.values():
            if not m.dead:
                self._settle(m)
        due = {m.cache_id for m in self.caches.values() if m.dead and m.pins == 0 and not m.freed}
        got = [e.cache_id for e in freed]
        assert len(got) == len(set(got)), f"an entry returned twice in one call: {got}"
        assert set(got) == due, f"freed {sorted(got)}, expected {sorted(due)}"
        for e in freed:
            m = self.caches[e.cache_id]
            assert not e.id_held and e.pins == 0
            m.freed = True
        self.returned.extend(freed)

    def _live(self) -> list[Model]:
        return [m for m in self.caches.values() if not m.dead]

    def _pick(self, data: st.DataObject, *, pinned: bool = False) -> int:
        pool = [m.cache_id for m in self.caches.values() if (m.pins > 0 if pinned else True)]
        return data.draw(st.sampled_from(pool + [self.next_id + 5]))

    # -- rules --

    @rule(keys=key_lists, rows=st.integers(1, 4), tensors=st.integers(1, 3))
    def allocate(self, keys: list[OwnerKey | None], rows: int, tensors: int) -> None:
        d = desc(rows, tensors)
        named = [k for k in keys if k is not None]
        ok = (len(keys) <= rows and len(set(named)) == len(named) and not any(k in self.keys for k in named))
        if not ok:
            assert code_of(self.reg.check_allocate_keys, d, keys) == INVALID
            return
        entry = allocate(self.reg, d, keys)
        assert entry.cache_id == self.next_id
        self.caches[entry.cache_id] = Model(entry.cache_id, rows, tensors, True, False, d.total_size)
        self.next_id += 1
        for i, k in enumerate(keys):
            if k is not None:
                self.keys[k] = (entry.cache_id, i)

    @rule(keys=key_lists, rows=st.integers(1, 4), tensors=st.integers(1, 3))
    def register(self, keys: list[OwnerKey | None], rows: int, tensors: int) -> None:
        d = desc(rows, tensors)
        if len(keys) > rows:
            keys = keys[:rows]
        entry = register(self.reg, d, keys)
        self.caches[entry.cache_id] = Model(entry.cache_id, rows, tensors, False, False, d.total_size)
        self.next_id += 1
        for i, k in enumerate(keys):
            if k is not None and k not in self.keys and (entry.cache_id, i) not in self.keys.values():
                self.keys[k] = (entry.cache_id, i)

    @rule(owned=st.booleans(), model_id=st.none() | st.integers(0, 1))
    def add_blocks(self, owned: bool, model_id: int | None) -> None:
        d = desc(rows=16)
        entry = self.reg.add(d, is_blocks=True, owned=owned, remote_accessible=True, memory=None)
        self.caches[entry.cache_id] = Model(entry.cache_id, 16, 2, owned, True, d.total_size)
        self.next_id += 1
        if model_id is None:
            return
        key = OwnerKey.blocks(model_id)
        if owned and key in self.keys:
            assert code_of(self.reg.bind_blocks_key, entry.cache_id, model_id, overwrite=False) == INVALID
            return
        self.reg.bind_blocks_key(entry.cache_id, model_id, overwrite=not owned)
        self.keys[key] = (entry.cache_id, 0)

    @rule(data=st.data())
    def release_id(self, data: st.DataObject) -> None:
        cid = self._pick(data)
        m = self.caches.get(cid)
        if m is not None and not m.dead and m.is_blocks:
            assert code_of(self.reg.release_id, CacheId(cid)) == INVALID
            return
        freed = self.reg.release_id(CacheId(cid))
        if m is not None and not m.dead and m.owned:
            m.id_held = False
        self._apply(freed)

    @rule(data=st.data())
    def remove_cache(self, data: st.DataObject) -> None:
        cid = self._pick(data)
        freed = self.reg.remove_cache(CacheId(cid))
        m = self.caches.get(cid)
        if m is not None and not m.dead:
            self._kill(m)
        self._apply(freed)

    @rule(key=st.sampled_from(KEYS + [OwnerKey.blocks(0)]))
    def remove_key(self, key: OwnerKey) -> None:
        freed = self.reg.remove_key(key)
        bound = self.keys.get(key)
        if bound is not None and self.caches[bound[0]].owned:
            self._unbind(key)
        self._apply(freed)

    @rule(key=st.sampled_from(KEYS + [OwnerKey.blocks(1)]), data=st.data())
    def consume_pulled(self, key: OwnerKey, data: st.DataObject) -> None:
        bound = self.keys.get(key)
        tensors = self.caches[bound[0]].tensors if bound is not None else 3
        first = data.draw(st.integers(0, tensors - 1))
        count = data.draw(st.integers(1, tensors - first))
        freed = self.reg.consume_pulled(key, range(first, first + count))
        if bound is not None:
            m = self.caches[bound[0]]
            if key.kind == KeyKind.REQ and m.owned and not m.is_blocks:
                done = self.pulled.setdefault(key, set())
                done.update(range(first, first + count))
                if len(done) == m.tensors:
                    self._unbind(key)
        self._apply(freed)

    @rule(data=st.data())
    def pin(self, data: st.DataObject) -> None:
        cid = self._pick(data)
        m = self.caches.get(cid)
        if m is None or m.dead:
            assert code_of(self.reg.pin, CacheId(cid)) == NOT_EXIST
            return
        assert self.reg.pin(CacheId(cid)).cache_id == cid
        m.pins += 1

    @precondition(lambda self: any(m.pins > 0 for m in self.caches.values()))
    @rule(data=st.data())
    def unpin(self, data: st.DataObject) -> None:
        cid = self._pick(data, pinned=True)
        m = self.caches.get(cid)
        freed = self.reg.unpin(CacheId(cid))
        if m is not None and m.pins > 0:
            m.pins -= 1
        self._apply(freed)

    # -- invariants --

    @invariant()
    def registry_matches_the_model(self) -> None:
        live = {m.cache_id for m in self._live()}
        assert {e.cache_id for e in self.reg.entries()} == live
        for key, (cid, batch) in self.keys.items():
            entry, got_batch = self.reg.lookup(key)
            assert (entry.cache_id, got_batch) == (cid, batch)
        for key in KEYS + [OwnerKey.blocks(0), OwnerKey.blocks(1)]:
            if key not in self.keys:
                assert code_of(self.reg.lookup, key) == NOT_EXIST
        for m in self._live():
            got = sorted(self.reg.keys_of(CacheId(m.cache_id)), key=repr)
            assert got == sorted(self._keys_of(m.cache_id), key=repr)
            entry = self.reg.get(CacheId(m.cache_id))
            assert entry.pins == m.pins and entry.id_held == m.id_held
            if not m.is_blocks:
                for batch in range(m.rows):
                    want = [k for k, v in self.keys.items() if v == (m.cache_id, batch)]
                    assert self.reg.lookup_by_id(CacheId(m.cache_id), batch)[1] == (want[0] if want else None)
        held = sum(m.size for m in self.caches.values() if m.owned and not m.freed)
        assert self.reg.bytes_owned == held
        # an entry is freed only once nothing holds it
        for m in self.caches.values():
            if m.freed:
                assert m.pins == 0 and not m.id_held and not self._keys_of(m.cache_id)

    def teardown(self) -> None:
        rest = self.reg.clear()
        ids = [e.cache_id for e in self.returned + rest]
        assert len(ids) == len(set(ids)), "an entry was returned twice"
        assert set(ids) == set(self.caches), "an entry was never returned"
        assert self.reg.bytes_owned == 0 and self.reg.entries() == []


RegistryMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TestRegistryStateMachine = RegistryMachine.TestCase


def test_uint64_max_blocks_key_is_distinct_from_req_keys() -> None:
    reg = CacheRegistry()
    b = blocks(reg, owned=True, model_id=0)
    e = allocate(reg, keys=[req(UINT64_MAX - 1)])
    assert reg.lookup(OwnerKey.blocks(0)) == (b, 0)
    assert reg.lookup(req(UINT64_MAX - 1)) == (e, 0)
