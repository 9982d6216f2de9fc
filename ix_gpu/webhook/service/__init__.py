"""The HTTPS admission service around :mod:`ix_gpu.webhook.core`.

What talks to the outside world lives here: uvicorn's server with its connection protocol (which
answers ``/mutate`` itself) and a FastAPI app for the other paths, AdmissionReview envelopes, the
namespace and claim list+watch caches, file hot reload and the Prometheus metrics (certificates
and TLS contexts are :mod:`ix_gpu.webhook.certs`). It may import the core, the certs,
:mod:`ix_gpu.devicemodel`, :mod:`ix_gpu.config` and the support packages (:mod:`ix_gpu.kube`,
:mod:`ix_gpu.process`, :mod:`ix_gpu.serving`); never :mod:`ix_gpu.plugin`.
"""
