"""How a MergeSink reruns a batch whose commit conflicted with another writer's (several
flows into one table): a budget of its own and exponential backoff with jitter."""

from __future__ import annotations

import random

# Reruns of a batch whose commit conflicted with another writer's (several flows into one table):
# at most this many, the n-th after a pause of min(cap, first * 2**(n-1)) seconds times a random
# factor in [0.5, 1) (exponential backoff with jitter, so two flows that conflicted do not meet
# again in step). With the defaults: 8 reruns, pauses of 0.05-0.1, 0.1-0.2, ... 2.5-5 s, at most
# 16.3 s of pauses in all before the batch fails with the last ConcurrentModificationError.
DEFAULT_MAX_CONFLICT_RETRIES = 8
DEFAULT_CONFLICT_BACKOFF = (0.1, 5.0)  # seconds: the first pause's bound, the bound of every pause


def conflict_backoff(retry: int, first: float, cap: float, rng: random.Random | None = None) -> float:
    """The pause before conflict rerun ``retry`` (1, 2, ...): min(cap, first * 2**(retry-1))
    scaled by a random factor in [0.5, 1)."""
    bound = min(cap, first * 2 ** (retry - 1))
    return bound * (0.5 + 0.5 * (rng or random).random())
