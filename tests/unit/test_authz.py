"""The one authorization point for link setup (``datadistd.guard.authz``)."""

from __future__ import annotations

import pytest

from datadistd.core.errors import DataDistError, StatusCode
from datadistd.guard.authz import OWN, REMOTE, authorize_displace, authorize_local_link


def test_same_daemon_links_only_within_one_uid():
    authorize_local_link(1000, 1000)
    with pytest.raises(DataDistError) as info:
        authorize_local_link(1000, 1001)
    assert info.value.code == StatusCode.LLM_LINK_FAILED
    assert "1000" not in info.value.message and "1001" not in info.value.message   # no uid, no cluster id


def test_a_served_link_is_displaced_only_by_its_own_origin():
    engine, other = object(), object()
    authorize_displace(2, None, engine)          # nothing to displace
    authorize_displace(2, engine, engine)        # the same engine relinks
    authorize_displace(2, REMOTE, REMOTE)        # a restarted peer relinks
    # the engine's own link to that cluster: nobody stands in for it, whatever origin
    for old, new in ((REMOTE, engine), (engine, REMOTE), (engine, other), (OWN, REMOTE), (OWN, engine), (OWN, OWN)):
        with pytest.raises(DataDistError) as info:
            authorize_displace(2, old, new)
        assert info.value.code == StatusCode.LLM_ALREADY_LINK
