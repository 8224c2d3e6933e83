"""A reproducible random stream for tests of private runs.

privcal refuses a plain ``random.Random`` on a charged run (a seeded generator makes the
release a function of the data anyone knowing the seed can compute:
:func:`privcal.calibrators.base.unpredictable`). A test that needs the same
release every time deliberately passes for the OS CSPRNG instead: :class:`Seeded` is a
:class:`random.SystemRandom` whose draws are ``random.Random(seed)``'s, the same numbers in
the same order (``random``, ``getrandbits`` and everything built on them), so a test's
expected values are those it had with ``random.Random(seed)``. Test code only."""

from __future__ import annotations

import random

from privcal.calibrators.base import TEST_DOUBLES


class Seeded(random.SystemRandom):
    """``random.Random(seed)``'s stream, typed as the CSPRNG a private run requires."""

    def __init__(self, seed: object = None) -> None:
        self._stream = random.Random(seed)
        super().__init__()

    def random(self) -> float:
        return self._stream.random()

    def getrandbits(self, k: int) -> int:
        return self._stream.getrandbits(k)


TEST_DOUBLES.add(Seeded)  # accepted by unpredictable(): a test's choice, never a caller's
