"""The cubic of probe-token-dq-exp2-fma.patch (docs/kernel-notes.md, "Twenty-first session", trial 2): 2^f on
[-1/2, 1/2] by a least-squares fit of the relative error on Chebyshev nodes, and its largest relative error.

    python docs/measurements/exp2-cubic-fit.py

Prints the coefficients (c0..c3; the patch's _E0.._E3) and the error (7.7e-5; degree 4: 2.7e-6).
"""
import numpy as np

f = np.cos(np.pi * (np.arange(2000) + 0.5) / 2000) * 0.5
grid = np.linspace(-0.5, 0.5, 100001)
for degree in (3, 4):
    a = np.stack([f ** k for k in range(degree + 1)], 1) / (2.0 ** f)[:, None]
    c = np.linalg.lstsq(a, np.ones_like(f), rcond=None)[0]
    err = np.abs(sum(c[k] * grid ** k for k in range(degree + 1)) / 2.0 ** grid - 1).max()
    print(f"degree {degree}: coefficients {c.tolist()}, max relative error {err:.2e}")
