"""The HTTPS admission service around :mod:`ix_gpu.webhook.core`.

What talks to the outside world lives here: uvicorn's server with its connection protocol (which
answers ``/mutate`` itself) and a FastAPI app for the other paths, AdmissionReview envelopes, TLS
contexts and certificates, the namespace list+watch cache, file hot reload, the self-managed
certificate Secret and the Prometheus metrics. It may import the core,
:mod:`ix_gpu.devicemodel`, :mod:`ix_gpu.config` and :mod:`ix_gpu.runtime`; never :mod:`ix_gpu.plugin`.
"""
