"""Poisson cohorts (data/sources.py: sample_cohort(..., 'poisson'), poisson_slots): each of N
clients joins a round independently with probability q = K / N, so the cohort's mean size is
q·N = K within a binomial bound over many rounds, and the fixed slot count is never exceeded in
practice. A wrong sampling rate fails here, beside the sampler."""

import math

import numpy as np
import pytest
from scipy import stats

from paxlike.data import sources
from paxlike.errors import RunFailure

N, K = 400, 100  # DigitsDpFedAvg's population and expected cohort.


@pytest.mark.parametrize('n, k', [(N, K), (1000, 10)])
def test_cohort_sizes_are_binomial_with_mean_qn_and_membership_is_independent(n, k):
  sizes, steps, q = np.ones(n), 2000, k / n
  cohorts = np.stack([sources.sample_cohort(3, s, sizes, k, 'poisson') for s in range(steps)])
  assert cohorts.shape == (steps, sources.poisson_slots(n, k))
  counts = (cohorts != sources.PADDED).sum(axis=1)
  sd = math.sqrt(n * q * (1 - q))
  bound = 5 * sd / math.sqrt(steps)
  assert abs(counts.mean() - q * n) < bound
  assert bound < 1  # So a rate of (k ± 1) / n would fail the line above.
  assert counts.var(ddof=1) == pytest.approx(sd**2, rel=0.2)  # sd of s²/σ² ≈ √(2/T) = 3%.
  for row, joined in zip(cohorts, counts):  # Distinct members in order, then padding.
    assert np.all(np.diff(row[:joined]) > 0) and np.all(row[joined:] == sources.PADDED)
  member = np.zeros((steps, n), bool)
  rows, slots = np.nonzero(cohorts != sources.PADDED)
  member[rows, cohorts[rows, slots]] = True
  assert abs(member.mean(axis=0) - q).max() < 5 * math.sqrt(q * (1 - q) / steps)
  # Independence: client pairs join together with probability q², not more or less.
  both = (member[:, ::2] & member[:, 1::2]).mean()
  assert both == pytest.approx(q * q, abs=5 * math.sqrt(q * q / (steps * n / 2)))


def test_cap_makes_overflow_practically_impossible_and_overflow_fails_loudly(monkeypatch):
  for n, k in [(N, K), (400, 1), (1000, 10), (100_000, 100)]:
    slots = sources.poisson_slots(n, k)
    assert slots >= k + 8 * math.sqrt(k * (1 - k / n)) and slots <= n
    assert stats.binom.sf(slots, n, k / n) <= 1e-12  # P(more than `slots` join).
  assert sources.poisson_slots(20, 20) == 20 and sources.poisson_slots(20, 5) == 20
  monkeypatch.setattr(sources, '_cached_slots', lambda n, k: k // 2)
  with pytest.raises(RunFailure, match='more than its 50 slots'):
    sources.poisson_cohort(0, 1, N, K)
