"""The mutating admission webhook.

- :mod:`ix_gpu.webhook.core`: the pure mutation (object, namespace facts, config) -> (ops, warnings).
- :mod:`ix_gpu.webhook.service`: the HTTPS shell around it (FastAPI/uvicorn, namespace and claim
  caches, hot reload, limits, metrics).
- :mod:`ix_gpu.webhook.certs`: its TLS: generated material, self-managed certificates, the context.
- ``cli`` and ``mutate_command``: the ``ix-gpu mutate/config/certs/webhook`` subcommands.

May import :mod:`ix_gpu.devicemodel`, :mod:`ix_gpu.config` and the support packages
(:mod:`ix_gpu.kube`, :mod:`ix_gpu.process`, :mod:`ix_gpu.serving`); never :mod:`ix_gpu.plugin`.
"""
