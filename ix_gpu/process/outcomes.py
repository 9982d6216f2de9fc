"""The ``result`` label values of ix-gpu's Prometheus counters, one pair for both processes.

Dashboards and alerts written for one process then read the other: a reload, a registration or an
Allocate either succeeded or not. (The webhook's admission counter is different: its ``result`` is
the admission decision, such as ``patched`` or ``denied``.)
"""

from __future__ import annotations

from typing import Final

SUCCESS: Final = "success"
ERROR: Final = "error"
