"""The domain of datadistd: typed ids, records, keys, reference counts, block/layer arithmetic.

Rule: nothing under ``core`` imports grpc or any device library.
"""
