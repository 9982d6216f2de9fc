"""The device model shared by the webhook and the device plugin.

Pure data and validation only: vendors, resource names, node label keys, quantities and the
configuration schemas. Nothing here talks to a cluster or a GPU, so both processes (and the tests)
can import it freely. It imports nothing else from :mod:`ix_gpu`.
"""
