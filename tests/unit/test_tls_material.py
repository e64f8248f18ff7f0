"""``PeerTls``: the [tls] files are checked at start, re-read when they change, and a changed set that
does not load never replaces the last good one (one warning per bad state, not one per connection)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import trustme

from datadistd.api.grpc.tls import PeerTls, TlsError, TlsFiles


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


@pytest.fixture
def files(tmp_path: Path) -> tuple[TlsFiles, trustme.CA]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    paths = TlsFiles(str(tmp_path / "node.pem"), str(tmp_path / "node.key"), str(tmp_path / "ca.pem"))
    _write(Path(paths.cert_file), cert.cert_chain_pems[0].bytes())
    _write(Path(paths.key_file), cert.private_key_pem.bytes())
    _write(Path(paths.ca_file), ca.cert_pem.bytes())
    return paths, ca


def _reissue(files: TlsFiles, ca: trustme.CA) -> bytes:
    cert = ca.issue_cert("127.0.0.1")
    _write(Path(files.key_file), cert.private_key_pem.bytes())
    _write(Path(files.cert_file), cert.cert_chain_pems[0].bytes())
    return cert.cert_chain_pems[0].bytes()


def test_bad_sets_are_refused_at_start(files, tmp_path: Path) -> None:  # noqa: ANN001
    good, ca = files
    other_key = ca.issue_cert("127.0.0.1").private_key_pem.bytes()
    (tmp_path / "other.key").write_bytes(other_key)
    with pytest.raises(TlsError, match="not a matching PEM certificate and private key"):
        PeerTls(TlsFiles(good.cert_file, str(tmp_path / "other.key"), good.ca_file))
    with pytest.raises(TlsError, match="ca_file .* No such file or directory"):
        PeerTls(TlsFiles(good.cert_file, good.key_file, str(tmp_path / "absent.pem")))
    (tmp_path / "junk.pem").write_text("junk\n")
    with pytest.raises(TlsError, match="is not a PEM CA bundle"):
        PeerTls(TlsFiles(good.cert_file, good.key_file, str(tmp_path / "junk.pem")))


def test_reloads_changed_files_and_keeps_the_last_good_set(files, caplog) -> None:  # noqa: ANN001
    paths, ca = files
    tls = PeerTls(paths, server_name="prompt.kv.internal")
    first = tls.current()
    assert tls.current() is first  # unchanged files: no re-read
    assert tls.channel_options() == [("grpc.ssl_target_name_override", "prompt.kv.internal")]
    new_cert = _reissue(paths, ca)
    second = tls.current()
    assert second.cert == new_cert != first.cert
    # a key that does not match: refused, warned once however often it is asked
    _write(Path(paths.key_file), ca.issue_cert("127.0.0.1").private_key_pem.bytes())
    with caplog.at_level(logging.WARNING, logger="datadistd.api.grpc.tls"):
        for _ in range(5):
            assert tls.current() is second
    assert [r.getMessage() for r in caplog.records].count(caplog.records[0].getMessage()) == 1
    assert "do not load" in caplog.records[0].getMessage()
    # a file gone missing mid-rotation: same
    os.unlink(paths.ca_file)
    assert tls.current() is second
    # the set mended: taken at the next ask
    _write(Path(paths.ca_file), ca.cert_pem.bytes())
    third_cert = _reissue(paths, ca)
    assert tls.current().cert == third_cert


def test_a_listener_gets_a_new_configuration_only_when_the_files_change(files) -> None:  # noqa: ANN001
    paths, ca = files
    tls = PeerTls(paths)
    fetch = tls.certificate_fetcher()
    assert fetch() is None and fetch() is None  # every connection asks; nothing changed
    _reissue(paths, ca)
    assert fetch() is not None  # the next handshake uses the new certificate
    assert fetch() is None
    _write(Path(paths.key_file), ca.issue_cert("127.0.0.1").private_key_pem.bytes())
    assert fetch() is None  # a broken set is never served
    assert tls.server_credentials() is not None and tls.channel_credentials() is not None
    assert tls.channel_options() == [] and "mutual TLS" in tls.describe()
