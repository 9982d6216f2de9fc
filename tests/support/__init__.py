"""Helpers shared by every test suite, imported as ``tests.support.<module>``.

- ``paths``: where the checkout and its example files are.
- ``cli``: the ``ix-gpu`` CLI of this checkout, run to completion or started in the background.
- ``processes``: a started process with its output in a log file (``Process``, ``start_process``).
- ``waiting``: ``wait_until`` (and an asyncio variant), the one bounded polling loop.
- ``net``: ``free_port``.
- ``files``: ``write_atomic`` for files that a process under test re-reads.
- ``webhook_process``: the real ``ix-gpu webhook`` over HTTPS (``WebhookProcess``, certificates).
- ``plugin_process``: the real ``ix-gpu plugin --backend fake`` (``PluginProcess``).
- ``objects``: Pods, TFJobs and AdmissionReviews as the apiserver would send them.
- ``k8s_schema``: validation against the Kubernetes OpenAPI schemas.
"""
