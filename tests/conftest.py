"""Settings for the whole test process, applied before any test module imports gRPC.

The suite runs in one process: the plugin's and DRA's tests start gRPC servers and channels in it,
and the webhook's tests fork review workers (``HeavyLane``) from it. gRPC's fork handlers, which
are on by default, make a ``fork`` wait for gRPC's own threads to stop; once, under CI load, that
wait took a worker's whole 5 s budget and the test saw ``OverBudget`` where the child had simply
failed. The webhook process never loads gRPC, so in production its forks never meet those
handlers; here they are turned off so the webhook's tests measure the webhook.
"""

import os

os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "false"
