"""Reference epsilons from Google's dp_accounting PLD accountant (add-or-remove adjacency,
Poisson-sampled Gaussian), used as golden values in tests/privacy/accountant.rs. dp_accounting is not a
dependency of the project; to regenerate:

    .venv/bin/pip install --target /tmp/dpa dp-accounting
    PYTHONPATH=/tmp/dpa .venv/bin/python benches/pld_reference.py
"""
import json

import dp_accounting
from dp_accounting.pld import pld_privacy_accountant

CASES = [
    # (q, sigma, steps, delta)
    (0.04, 1.5, 2250, 1e-5),
    (128 / 50000, 0.8, 39100, 1e-5),
    (1 / 502, 0.4, 50200, 8e-5),
    (0.01, 1.0, 1000, 1e-5),
    (0.1, 2.0, 100, 1e-6),
]

rows = []
for q, sigma, steps, delta in CASES:
    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    accountant.compose(event)
    rows.append({"q": q, "sigma": sigma, "steps": steps, "delta": delta,
                 "epsilon": accountant.get_epsilon(delta)})
import importlib.metadata
print(json.dumps({"dp_accounting": importlib.metadata.version("dp-accounting"),
                  "value_discretization_interval": 1e-4, "cases": rows}, indent=1))
