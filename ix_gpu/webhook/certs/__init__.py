"""The webhook's TLS: material generated for it (``ix-gpu certs generate``), self-managed
certificates (the chart's ``certs.mode: self``) and the server's context."""
