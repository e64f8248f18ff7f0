"""datadist wire contract: generated protobuf/gRPC stubs (``datadist.v1``) and the status table.

Everything in this package is shared by the daemon (``datadistd``) and the client
(``llm_datadist``); neither imports the other.
"""
