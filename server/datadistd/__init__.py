"""datadistd: the per-node KV-cache transfer daemon.

Importing this package imports no grpc and no device library; those load lazily
(``datadistd.api.grpc`` for the gRPC layer, memory/transport backends by name).
"""

__version__ = "0.1.0"
