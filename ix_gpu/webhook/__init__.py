"""The mutating admission webhook.

- :mod:`ix_gpu.webhook.core`: the pure mutation (object, namespace facts, config) -> (ops, warnings).
- :mod:`ix_gpu.webhook.service`: the HTTPS shell around it (FastAPI/uvicorn, TLS, namespace cache,
  hot reload, self-managed certificates, metrics).
- ``cli`` and ``mutate_command``: the ``ix-gpu mutate/config/certs/webhook`` subcommands.

May import :mod:`ix_gpu.devicemodel`, :mod:`ix_gpu.config` and :mod:`ix_gpu.runtime`; never
:mod:`ix_gpu.plugin`.
"""
