"""The gRPC ways in: the DataDist and Peer servicers, proto <-> domain conversion, the one error mapping, the peer
client, the server factory, TLS material and the peer port's admission front. Only ``api`` and ``process`` import
grpc (``tests/unit/test_layering.py``)."""
