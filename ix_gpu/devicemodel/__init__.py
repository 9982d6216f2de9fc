"""The device model shared by the webhook and the plugins.

Pure data only: vendors, resource names, node label keys, quantities, the one-allocator-per-node
rule and the plugin's runtime settings. The configuration schemas and their YAML loader are in
:mod:`ix_gpu.config`. Nothing here talks to a cluster or a GPU, so every process (and the tests)
can import it freely. It imports nothing else from :mod:`ix_gpu`.
"""
