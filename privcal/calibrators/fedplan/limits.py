"""Resource bounds and argument checks of federated planning (issue 16.2).

Checked before any plan is computed, and so before anything is charged.
"""

from __future__ import annotations

import math

import numpy as np

from privcal.calibrators.bound_floats import count_text
from privcal.errors import InvalidInput

#: Resource bounds (issue 16.2), checked before any plan is computed and so before anything
#: is charged. Planning costs grow with the number of agents m (≈ 10 s for FedCP-QQ and
#: ≈ 30 s for FedCP²-QQ at m = 10 000 on a loaded 2-core machine; m = 10⁷ ran > 300 s and
#: m = 10⁹ exhausted memory): m ≤ MAX_AGENTS. Local sizes and the grid are bounded so that
#: an agent's work arrays stay O(10⁸) elements.
MAX_AGENTS = 10_000
MAX_LOCAL_N = 100_000_000
MAX_BINS = 1_000_000


def check_int(name: str, v: object, lo: int, hi: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int | np.integer):
        raise InvalidInput(f"{name} must be an integer, got {v!r}")
    v = int(v)
    if v < lo or (hi is not None and v > hi):
        rng = f"[{lo}, {hi}]" if hi is not None else f"≥ {lo}"
        raise InvalidInput(f"{name} must be in {rng}, got {count_text(v)}")
    return v


def check_alpha(alpha: object) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, int | float):
        raise InvalidInput(f"α must be a number in (0, 1), got {alpha!r}")
    a = float(alpha)
    if not (math.isfinite(a) and 0 < a < 1):
        raise InvalidInput(f"α must be in (0, 1), got {alpha}")
    return a

