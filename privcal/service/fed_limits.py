"""How much federated planning one HTTP request may ask for (red team 6).

Planning is exact and its cost grows with the number of agents m and the local size n:
FedCP-QQ evaluates the coverage M_{ℓ,k} for every server order k, FedCP²-QQ repeats that
for up to 99 γ, unequal sizes build an m-term Poisson-binomial law per quadrature node.
The library and the CLI plan any size up to :mod:`privcal.calibrators.fedplan.limits`
(10 000 agents: minutes); a service request runs in a server thread, so
``POST /v1/fed/plan``, the opening of a federated session
(``POST /v1/datasets/{name}/sessions``) and a federated calibration
(``POST /v1/datasets/{name}/calibrations``, its agents' sizes counted from its agent ids;
red team 7) accept only what plans in about 2 s of CPU on a
loaded 2-core machine (measured worst cases over α, ε and the grid, red team 6):

- FedCP-QQ, equal sizes: m ≤ 1 000 agents, n ≤ 100 000 scores each (≤ 1.8 s);
- FedCP-QQ, unequal sizes: ≤ 100 sizes, each ≤ 100 000 (≤ 0.8 s);
- FedCP²-QQ (an ``epsilon``): m ≤ 50 agents, n ≤ 10 000 scores each (≤ 3 s of CPU measured
  by the lead at m = 50, n = 10⁴, ε = 0.01, an infeasible plan: infeasible requests are the
  slowest, every γ is searched; the time grows about linearly in m — 1 000 agents at
  ε = 0.01 took 73 s).

A larger request is refused (422 ``invalid-input``, one line naming the limit), before
anything is planned, charged or written; plan it with ``privcal fed plan`` or
:func:`privcal.calibrators.fedplan_choice.plan_federated`, which have no such limit.
"""

from __future__ import annotations

from collections.abc import Sequence

from privcal.errors import InvalidInput

__all__ = ["FED2_MAX_AGENTS", "FED2_MAX_LOCAL_N", "FED_MAX_AGENTS", "FED_MAX_LOCAL_N",
           "FED_MAX_SIZES", "check_fed_work"]

#: FedCP-QQ with equal local sizes
FED_MAX_AGENTS = 1_000
FED_MAX_LOCAL_N = 100_000
#: FedCP-QQ with unequal local sizes: the number of sizes (each ≤ FED_MAX_LOCAL_N)
FED_MAX_SIZES = 100
#: FedCP²-QQ
FED2_MAX_AGENTS = 50
FED2_MAX_LOCAL_N = 10_000

_CLI = "; the CLI (privcal fed plan) and the library have no such limit"


def check_fed_work(agents: int | None, sizes: Sequence[int], private: bool) -> None:
    """InvalidInput (one line) if planning ``agents`` agents of local ``sizes`` (one size
    for all, or one each) is more work than a service request may ask for; ``private``:
    FedCP²-QQ (an ε). Sizes < 1 and other bad input are left to the library's checks."""
    what = "FedCP²-QQ (an epsilon)" if private else "FedCP-QQ"
    max_m, max_n = (FED2_MAX_AGENTS, FED2_MAX_LOCAL_N) if private else (FED_MAX_AGENTS,
                                                                        FED_MAX_LOCAL_N)
    m = max(agents or 0, len(sizes))
    # every size decides "unequal" (red team 18: 1 000 sizes whose first 101 were equal were
    # planned as equal ones, 16 s of CPU a request); linear in the body, which is bounded
    if not private and len(set(sizes)) > 1:
        if len(sizes) > FED_MAX_SIZES:
            raise InvalidInput(f"the service plans FedCP-QQ with unequal local sizes for at "
                               f"most {FED_MAX_SIZES} agents, got {len(sizes)}{_CLI}")
    elif m > max_m:
        raise InvalidInput(f"the service plans {what} for at most {max_m} agents, got "
                           f"{m}{_CLI}")
    if sizes and max(sizes) > max_n:
        raise InvalidInput(f"the service plans {what} for local sizes of at most {max_n} "
                           f"scores, got {max(sizes)}{_CLI}")
