"""What a maintenance round did.

Maintenance produces it and the metrics count it; it lives here, apart from both, so that
neither module has to import the other.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class MaintenanceResult:
    requeued: int = 0
    dead: int = 0
    cancelled: int = 0
    pruned: int = 0
    skipped: bool = False  # another runner held the lock
