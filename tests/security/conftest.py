"""Shared fixtures of the security tests."""

from __future__ import annotations

import pytest

from tests.daemonproc import DaemonProcess


@pytest.fixture
def daemon():
    """One ``datadistd`` of this user on a private socket, stopped and removed after the test (modules that
    run the daemon as a throwaway user import ``test_users.daemon`` instead, which overrides this one)."""
    d = DaemonProcess("sec")
    d.start()
    yield d
    d.stop()
    d.discard()
