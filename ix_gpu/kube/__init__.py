"""The Kubernetes API as every process of ours reaches it, with the standard library alone: the
light client (:mod:`.apiserver`: in-cluster or from a kubeconfig, token re-read on every use), the
kubeconfig reader, and list + watch with the caches kept on it (:mod:`.list_watch`,
:mod:`.watched_cache`). Below the webhook, the node agents and ``ix-gpu status``; it imports only
:mod:`ix_gpu.config` (error text, capped reads) from ix_gpu.
"""
