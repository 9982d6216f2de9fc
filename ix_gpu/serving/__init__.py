"""The small HTTP side every process shares: the guarded HTTP/1.1 server for probe and metrics
endpoints (:mod:`.guarded_http`), the node agents' ``/healthz`` and ``/metrics`` on it
(:mod:`.agent_http`), their hand-written Prometheus text (:mod:`.text_metrics`: no
prometheus_client on a GPU node) and who keeps a connection slot when a server is full
(:mod:`.connection_slots`, the webhook's too). Below every process.
"""
