"""The Peer service is what happens before a link's data channel exists, and nothing more (issue 26): after
the handshake the authenticated data channel carries owner calls, unlink and liveness as frames. A second
path for any of them (an owner-call RPC, a reverse stream) must not come back."""

from __future__ import annotations

from datadist.v1 import peer_pb2

#: the pre-channel RPCs: all the Peer service may have
PRE_CHANNEL = {"Challenge", "Handshake"}
#: what the data channel carries; an RPC of one of these names (or any streaming RPC) is a second path
FRAME_ONLY = {"Read", "Release", "OpenWrite", "CommitWrite", "Reverse", "Unlink", "Ping"}


def test_the_peer_service_has_only_the_pre_channel_rpcs() -> None:
    methods = peer_pb2.DESCRIPTOR.services_by_name["Peer"].methods
    names = {m.name for m in methods}
    assert not names & FRAME_ONLY, f"owner-call RPCs are back in peer.proto: {sorted(names & FRAME_ONLY)}"
    assert names == PRE_CHANNEL, f"the Peer service grew {sorted(names - PRE_CHANNEL)}: after the handshake, " \
                                 f"use a frame on the data channel (datadistd.links.wire.ownercalls)"
    assert not any(m.client_streaming or m.server_streaming for m in methods)


def test_owner_calls_have_one_encoding() -> None:
    """Every kind of owner call (the removed RPCs') is an ``ownerwire`` frame, and peer.proto has
    no message for one: a second encoding must not come back."""
    import typing

    from datadistd.links.wire import ownerwire
    from datadistd.links.wire.ownercalls import OwnerCall

    kinds = {cls.__name__ for cls in typing.get_args(OwnerCall)}
    assert kinds == {"OpenWriteCmd", "CommitWriteCmd", "ReadCmd", "ReleaseCmd", "UnlinkCmd", "PingCmd", "WriteCmd",
                     "NotifyCmd"}
    assert len(ownerwire._SMALLEST) == len(kinds)
    messages = set(peer_pb2.DESCRIPTOR.message_types_by_name)
    assert messages == {"ChallengeRequest", "ChallengeResponse", "HandshakeRequest", "HandshakeResponse",
                        "CacheLayout"}, f"peer.proto grew {sorted(messages)}: owner calls are ownerwire frames"
