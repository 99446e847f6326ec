"""Reference values of the one-run audit bound (Steinke, Nasr and Jagielski, "Privacy Auditing
with One (1) Training Run", NeurIPS 2023): the p-value of v right guesses out of r about m
canaries under (eps, delta)-DP, and the largest eps refuted at confidence 1 - p, computed with
scipy's binomial distribution as the paper's algorithm states it. Golden values for
tests/privacy/audit.rs. scipy is not a dependency of the project; to regenerate:

    .venv/bin/pip install scipy   # if missing
    .venv/bin/python benches/audit_reference.py
"""
import json
import math

from scipy import stats


def p_value(m, r, v, eps, delta):
    assert 0 <= v <= r <= m and eps >= 0 and 0 <= delta <= 1
    q = 1 / (1 + math.exp(-eps))
    beta = stats.binom.sf(v - 1, r, q)  # P[Binomial(r, q) >= v]
    alpha, below = 0.0, 0.0
    for i in range(1, v + 1):
        below += stats.binom.pmf(v - i, r, q)
        alpha = max(alpha, below / i)
    return min(beta + alpha * delta * 2 * m, 1.0)


def epsilon_lower_bound(m, r, v, delta, p):
    low, high = 0.0, 1.0
    if p_value(m, r, v, low, delta) >= p:
        return 0.0
    while p_value(m, r, v, high, delta) < p:
        high += 1
    for _ in range(60):
        middle = (low + high) / 2
        if p_value(m, r, v, middle, delta) < p:
            low = middle
        else:
            high = middle
    return low


P_CASES = [
    # (m, r, v, eps, delta)
    (1000, 100, 90, 1.0, 0.0),
    (1000, 100, 90, 1.0, 1e-5),
    (1000, 100, 90, 2.0, 1e-5),
    (10000, 1000, 700, 0.5, 1e-5),
    (1000, 1000, 500, 0.0, 0.0),
    (200, 50, 50, 3.0, 1e-3),
    (200, 50, 0, 1.0, 1e-5),
]
EPS_CASES = [
    # (m, r, v, delta, p)
    (1000, 100, 90, 0.0, 0.05),
    (1000, 100, 90, 1e-5, 0.05),
    (1000, 100, 100, 1e-5, 0.05),
    (10000, 1000, 700, 1e-5, 0.05),
    (10000, 1000, 1000, 1e-5, 0.05),
    (1000, 1000, 1000, 1e-5, 0.05),
    (1000, 100, 60, 1e-5, 0.05),
    (1000, 100, 50, 1e-5, 0.05),
    (5000, 400, 380, 1e-5, 0.01),
]

if __name__ == "__main__":
    out = {
        "p_value": [[*c, p_value(*c)] for c in P_CASES],
        "epsilon_lower_bound": [[*c, epsilon_lower_bound(*c)] for c in EPS_CASES],
    }
    print(json.dumps(out, indent=1))
