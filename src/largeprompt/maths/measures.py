"""Token measures μ and their cumulant generating functions (docs/theory.md#notation,
docs/theory.md#infinite-prompt-operator, docs/theory.md#gaussian-limit, docs/theory.md#rademacher-and-uniform-limits).

Each measure on R^D exposes

* ``sample(n, generator)``: i.i.d. tokens, shape ``[*n, D]``, from a torch or numpy Generator
  (:mod:`largeprompt.core.seeding`: numpy draws normals by its ziggurat, docs/theory.md#token-sampler);
* ``cgf(a)``: K(a) = log E_μ exp⟨a, z⟩, shape ``[...]``;
* ``cgf_grad(a)``: ∇K(a), the mean of the tilted measure μ_a, shape ``[..., D]``;
* ``cgf_hess(a)``: ∇²K(a), the covariance of μ_a, shape ``[..., D, D]``.

The infinite-prompt attention is T_μ(z_q) = V ∇K(U z_q) (docs/theory.md#infinite-prompt-operator), so these
three functions are all the pipeline needs to know about a measure.
"""
from __future__ import annotations

import math

import torch

from largeprompt.core.seeding import random_bits, standard_normal, uniform

SQRT3 = math.sqrt(3.0)
# Below this |x| the Langevin function and its relatives use their Taylor series:
# the closed forms lose all relative precision to cancellation near 0.
_SERIES_CUTOFF = 1e-2


def _shape(n) -> tuple[int, ...]:
    return (n,) if isinstance(n, int) else tuple(n)


def _in_float64(fn):
    """Evaluate in float64 and cast back: just above the series cutoff the closed forms cancel to
    ~1e-2 relative error in float32, but stay at ~1e-11 in float64."""

    def wrapped(x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float64:
            return fn(x)
        return fn(x.to(torch.float64)).to(x.dtype)

    wrapped.__doc__, wrapped.__name__ = fn.__doc__, fn.__name__
    return wrapped


@_in_float64
def langevin(x: torch.Tensor) -> torch.Tensor:
    """𝓛(x) = coth x − 1/x, stable at 0 (docs/theory.md#rademacher-and-uniform-limits); 𝓛(x) = x/3 − x³/45 + 2x⁵/945 − …"""
    small = x.abs() < _SERIES_CUTOFF
    safe = torch.where(small, torch.ones_like(x), x)
    closed = 1.0 / torch.tanh(safe) - 1.0 / safe
    x2 = x * x
    series = x * (1.0 / 3.0 - x2 / 45.0 + 2.0 * x2 * x2 / 945.0)
    return torch.where(small, series, closed)


@_in_float64
def langevin_derivative(x: torch.Tensor) -> torch.Tensor:
    """𝓛'(x) = 1/x² − 1/sinh²x, stable at 0 (series 1/3 − x²/15 + 2x⁴/189) and at large |x|."""
    small = x.abs() < _SERIES_CUTOFF
    safe = torch.where(small, torch.ones_like(x), x)
    # 1/sinh² x = 4 e^{-2|x|} / (1 - e^{-2|x|})², overflow-free for large |x|.
    e = torch.exp(-2.0 * safe.abs())
    closed = 1.0 / (safe * safe) - 4.0 * e / (1.0 - e) ** 2
    x2 = x * x
    series = 1.0 / 3.0 - x2 / 15.0 + 2.0 * x2 * x2 / 189.0
    return torch.where(small, series, closed)


@_in_float64
def log_sinhc(x: torch.Tensor) -> torch.Tensor:
    """log(sinh(x)/x), stable at 0 (series x²/6 − x⁴/180) and for large |x|."""
    small = x.abs() < _SERIES_CUTOFF
    ax = torch.where(small, torch.ones_like(x), x).abs()
    # log sinh|x| = |x| + log(1 − e^{−2|x|}) − log 2
    closed = ax + torch.log1p(-torch.exp(-2.0 * ax)) - math.log(2.0) - torch.log(ax)
    x2 = x * x
    series = x2 / 6.0 - x2 * x2 / 180.0
    return torch.where(small, series, closed)


def log_cosh(x: torch.Tensor) -> torch.Tensor:
    """log cosh x without overflow: |x| + log1p(e^{−2|x|}) − log 2."""
    ax = x.abs()
    return ax + torch.log1p(torch.exp(-2.0 * ax)) - math.log(2.0)


class TokenMeasure:
    """Base class: a measure on R^dim with an analytic CGF."""

    name = ""

    def __init__(self, dim: int, *, dtype: torch.dtype = torch.float64, device=None):
        self.dim = int(dim)
        self.dtype = dtype
        self.device = torch.device(device) if device is not None else torch.device("cpu")

    def sample(self, n, generator: torch.Generator | None = None) -> torch.Tensor:
        raise NotImplementedError

    def cgf(self, a: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def cgf_grad(self, a: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def cgf_hess(self, a: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @property
    def mean(self) -> torch.Tensor:
        return self.cgf_grad(torch.zeros(self.dim, dtype=self.dtype, device=self.device))

    @property
    def covariance(self) -> torch.Tensor:
        return self.cgf_hess(torch.zeros(self.dim, dtype=self.dtype, device=self.device))

    def to(self, device) -> TokenMeasure:  # pragma: no cover - overridden where state exists
        return self


class Gaussian(TokenMeasure):
    """μ = N(mean, cov): K(a) = aᵀm + ½ aᵀSa, ∇K = m + Sa, ∇²K = S (docs/theory.md#gaussian-limit, paper Lemma 2.1)."""

    def __init__(self, mean, cov, *, dtype: torch.dtype = torch.float64, device=None):
        if device is None:
            device = mean.device if isinstance(mean, torch.Tensor) else "cpu"
        m = torch.as_tensor(mean, dtype=dtype, device=device)
        s = torch.as_tensor(cov, dtype=dtype, device=device)
        if m.ndim != 1 or s.shape != (m.shape[0], m.shape[0]):
            raise ValueError(f"Gaussian needs mean [D] and cov [D, D]; got {tuple(m.shape)} and {tuple(s.shape)}")
        if not torch.allclose(s, s.T):
            raise ValueError("Gaussian covariance must be symmetric")
        super().__init__(int(m.shape[0]), dtype=dtype, device=device)
        self.name = "gaussian"
        self.loc = m
        self.cov = s
        self._chol = torch.linalg.cholesky(s)  # raises if S is not positive definite
        eye = torch.eye(m.shape[0], dtype=dtype, device=device)
        self._standard = bool((m == 0).all() and torch.equal(s, eye))  # N(0, I): a draw is its own sample

    def to(self, device) -> Gaussian:
        return Gaussian(self.loc.to(device), self.cov.to(device), dtype=self.dtype, device=device)

    def sample(self, n, generator=None):
        g = standard_normal((*_shape(n), self.dim), generator, self.dtype, self.device)
        return g if self._standard else self.loc + g @ self._chol.T  # [*n, D]; for N(0, I) the same numbers

    def cgf(self, a):
        return a @ self.loc + 0.5 * ((a @ self.cov) * a).sum(-1)

    def cgf_grad(self, a):
        return self.loc + a @ self.cov  # S symmetric: (S a)ᵀ = aᵀ S

    def cgf_hess(self, a):
        return self.cov.expand(*a.shape[:-1], self.dim, self.dim)


class Rademacher(TokenMeasure):
    """i.i.d. ±1 coordinates: K(a) = Σ log cosh aⱼ, ∇K = tanh(a), ∇²K = diag(1 − tanh² a) (docs/theory.md#rademacher-and-uniform-limits)."""

    def __init__(self, dim: int, *, dtype: torch.dtype = torch.float64, device=None):
        super().__init__(int(dim), dtype=dtype, device=device)
        self.name = "rademacher"

    def to(self, device) -> Rademacher:
        return Rademacher(self.dim, dtype=self.dtype, device=device)

    def sample(self, n, generator=None):
        bits = random_bits((*_shape(n), self.dim), generator, self.device)
        return bits.to(self.dtype).mul_(2).sub_(1)  # 2b − 1, exact, in one buffer

    def cgf(self, a):
        return log_cosh(a).sum(-1)

    def cgf_grad(self, a):
        return torch.tanh(a)

    def cgf_hess(self, a):
        return torch.diag_embed(1.0 - torch.tanh(a) ** 2)


class Uniform(TokenMeasure):
    """i.i.d. uniform coordinates on [−√3, √3] (unit variance).

    K(a) = Σ log(sinh(√3 aⱼ)/(√3 aⱼ)), ∇K = √3 𝓛(√3 a), ∇²K = diag(3 𝓛'(√3 a)) (docs/theory.md#rademacher-and-uniform-limits).
    """

    def __init__(self, dim: int, *, dtype: torch.dtype = torch.float64, device=None):
        super().__init__(int(dim), dtype=dtype, device=device)
        self.name = "uniform"

    def to(self, device) -> Uniform:
        return Uniform(self.dim, dtype=self.dtype, device=device)

    def sample(self, n, generator=None):
        r = uniform((*_shape(n), self.dim), generator, self.dtype, self.device)
        return r.mul_(2.0).sub_(1.0).mul_(SQRT3)  # √3 (2r − 1), in the draw's own buffer

    def cgf(self, a):
        return log_sinhc(SQRT3 * a).sum(-1)

    def cgf_grad(self, a):
        return SQRT3 * langevin(SQRT3 * a)

    def cgf_hess(self, a):
        return torch.diag_embed(3.0 * langevin_derivative(SQRT3 * a))


def toeplitz_covariance(dim: int, rho: float, scale: float = 1.0, dtype=torch.float64, device=None) -> torch.Tensor:
    """S_ij = scale · rho^|i−j| (the authors' §6 covariance with rho = 0.5)."""
    device = device if device is not None else "cpu"
    idx = torch.arange(dim, device=device)
    return scale * torch.as_tensor(rho, dtype=dtype, device=device) ** (idx[:, None] - idx[None, :]).abs().to(dtype)


def make_measure(name: str, dim: int, *, mean=None, cov=None, dtype=torch.float64, device=None) -> TokenMeasure:
    """Build a token measure from its config name ('gaussian', 'rademacher', 'uniform') on ``device``."""
    device = device if device is not None else "cpu"
    if name == "gaussian":
        mean = torch.zeros(dim, dtype=dtype, device=device) if mean is None else mean
        cov = torch.eye(dim, dtype=dtype, device=device) if cov is None else cov
        return Gaussian(mean, cov, dtype=dtype, device=device)
    if name == "rademacher":
        return Rademacher(dim, dtype=dtype, device=device)
    if name == "uniform":
        return Uniform(dim, dtype=dtype, device=device)
    raise ValueError(f"unknown token measure {name!r}; allowed: 'gaussian', 'rademacher', 'uniform'")


MEASURE_NAMES = ("gaussian", "rademacher", "uniform")
