"""In-context linear regression: the task and its Bayes predictor (docs/theory.md#icl-task, docs/theory.md#bayes-risk).

Tokens z = (x, y) ∈ R^D, D = d + 1, with x ~ N(0, Λ), y = βᵀx + σε, β ~ N(0, τ² I) per prompt.
The query token is z_q = (x_q, 0) and its target is y_q = βᵀx_q + σε_q (docs/theory.md#icl-task).
With ``token_measure`` rademacher or uniform, x has i.i.d. ±1 or U[−√3, √3] coordinates instead (Λ = I;
docs/theory.md#bounded-token-risk); the query x_q is drawn from the same measure.

Implemented as stated in docs/theory.md#icl-task. The authors' public generator differs
(docs/experiments.md#authors-data-generator): it applies the
covariance to the prompt x twice and never to x_q; we apply Λ once to every x, query included.
"""
from __future__ import annotations

import torch

from largeprompt.core.seeding import random_bits, standard_normal, uniform
from largeprompt.maths.measures import MEASURE_NAMES, SQRT3, toeplitz_covariance

EXCESS_KURTOSIS = {"gaussian": 0.0, "rademacher": -2.0, "uniform": -1.2}  # κ₄ = E x⁴ − 3 of a unit-variance coordinate


class RegressionTask:
    """The in-context regression task (docs/theory.md#icl-task): Λ = ``covariance`` [d, d], τ² = ``task_variance``,
    σ² = ``noise_variance``, covariates from ``token_measure`` (Λ must be I unless it is gaussian)."""

    def __init__(self, covariance, task_variance: float, noise_variance: float, token_measure: str = "gaussian"):
        if token_measure not in MEASURE_NAMES:
            raise ValueError(f"unknown token measure {token_measure!r}; allowed: {', '.join(MEASURE_NAMES)}")
        self.token_measure = token_measure
        self.excess_kurtosis = EXCESS_KURTOSIS[token_measure]  # κ₄: what linear attention sees of the measure at finite L
        self.covariance = torch.as_tensor(covariance, dtype=torch.float64, device="cpu")  # Λ [d, d], host copy
        self.task_variance = float(task_variance)  # τ²
        self.noise_variance = float(noise_variance)  # σ²
        self.dim = self.covariance.shape[0]  # d
        self.token_dim = self.dim + 1  # D
        self._chol = torch.linalg.cholesky(self.covariance)  # Λ = C Cᵀ
        if token_measure != "gaussian" and not torch.equal(self.covariance, torch.eye(self.dim, dtype=torch.float64)):
            raise ValueError(f"{token_measure} covariates have i.i.d. unit-variance coordinates: the covariance must be I")
        self._chol_cache = {}

    def sample(self, batch: int, prompt_length: int, generator=None, dtype=torch.float64, device="cpu"):
        """Draw ``batch`` prompts: (query_tokens [B, D], prompt_tokens [B, L, D], targets [B])."""
        return self.sample_with_tasks(batch, prompt_length, generator, dtype, device)[:3]

    def sample_with_tasks(self, batch: int, prompt_length: int, generator=None, dtype=torch.float64, device="cpu"):
        """As :meth:`sample`, also returning the task vectors β [B, d].

        One normal draw g [D, B, L+1] (:func:`largeprompt.core.seeding.standard_normal`) for the L + 1 tokens of
        every prompt, feature by feature (the floor), one for β; then x = C g_x (Λ = C Cᵀ) as one GEMM over all
        tokens and y = βᵀx + σ g_y, written in place. The tokens stay feature-major: the prompt is a [B, L, D]
        view with strides (L+1, 1, B(L+1)), whose [D, L] slices are the rows BLAS reads fastest in the step's two
        passes; no small per-prompt products (128 of them cost 25x the draw at L = 10).
        """
        if self.token_measure != "gaussian":
            return self._sample_bounded(batch, prompt_length, generator, dtype, device)
        d, L = self.dim, int(prompt_length)
        g, beta = self._gaussian_draw(batch, L, generator, dtype, device)  # [D, B, L+1], [B, d]
        beta = beta * self.task_variance**0.5
        chol = self._chol_in(dtype, device)
        x = g[:d]
        x.copy_((chol @ x.reshape(d, -1)).view(d, batch, L + 1))  # x = C g_x
        y = g[d]
        y.mul_(self.noise_variance**0.5)
        for j in range(d):  # y = βᵀx + σ g_y
            y.addcmul_(x[j], beta[:, j : j + 1])
        tokens = g.permute(1, 2, 0)  # [B, L+1, D]
        query = tokens[:, L].clone()  # [B, D]
        target = query[:, d].clone()  # [B]  y_q = βᵀx_q + σε_q
        query[:, d] = 0.0  # z_q = (x_q, 0)
        return query, tokens[:, :L], target, beta

    def sample_query_side(self, batch: int, prompt_length: int, generator=None, dtype=torch.float64, device="cpu"):
        """(query [B, D], target [B], β [B, d]) of :meth:`sample_with_tasks`'s draw: the same raw draws from the same
        generator (the prompt is drawn, to advance it, and dropped untransformed), for the coupled L = ∞ runs
        (docs/theory.md#coupled-limit)."""
        d, L = self.dim, int(prompt_length)
        if self.token_measure == "gaussian":
            g, beta = self._gaussian_draw(batch, L, generator, dtype, device)
            x, noise = (self._chol_in(dtype, device) @ g[:d, :, L]).T, g[d, :, L]  # [B, d], [B]
        else:
            raw, noise, beta = self._bounded_draw(batch, L, generator, dtype, device)
            x, noise = self._bounded_covariates(raw[:, L].to(dtype)), noise[:, L]
        beta = beta * self.task_variance**0.5
        target = (beta * x).sum(-1) + self.noise_variance**0.5 * noise
        return torch.cat([x, torch.zeros(batch, 1, dtype=dtype, device=device)], dim=1), target, beta

    def _gaussian_draw(self, batch: int, L: int, generator, dtype, device):
        """The raw draws of a Gaussian batch, in their order: g [D, B, L+1] for the tokens, then β/τ [B, d]."""
        g = standard_normal((self.dim + 1, batch, L + 1), generator, dtype, device)
        return g, standard_normal((batch, self.dim), generator, dtype, device)

    def _bounded_draw(self, batch: int, L: int, generator, dtype, device):
        """The raw draws of a bounded batch, in their order: bits or U[0, 1) [B, L+1, d] for the covariates, the noise
        [B, L+1], then β/τ [B, d]."""
        if self.token_measure == "rademacher":
            raw = random_bits((batch, L + 1, self.dim), generator, device)
        else:
            raw = uniform((batch, L + 1, self.dim), generator, dtype, device)
        noise = standard_normal((batch, L + 1), generator, dtype, device)
        return raw, noise, standard_normal((batch, self.dim), generator, dtype, device)

    def _bounded_covariates(self, x: torch.Tensor) -> torch.Tensor:
        """The covariates of raw draws ``x`` (a float copy, mapped in place): 2b − 1 (rademacher), √3(2u − 1) (uniform)."""
        return x.mul_(2).sub_(1) if self.token_measure == "rademacher" else x.mul_(2.0).sub_(1.0).mul_(SQRT3)

    def sample_whitened(self, batch: int, prompt_length: int, generator=None, dtype=torch.float64, device="cpu"):
        """The draw of :meth:`sample` (same numbers, same order, same law) with the prompt left whitened:
        (query [B, D], prompt' [B, L, D], target [B], T [D, D] or None), the prompt tokens z = T z', T = diag(C, 1).

        z' = (g_x, y) with y = (Cᵀβ)ᵀg_x + σ g_y = βᵀx + σε; the query (C g_q, 0) and its target are as in
        :meth:`sample`. The engine moves T into the weights (docs/experiments.md#whitened-draw), which saves the
        GEMM x = C g_x over every token. T is None for the bounded measures (Λ = I: their prompt is z itself).
        """
        if self.token_measure != "gaussian":
            return (*self.sample(batch, prompt_length, generator, dtype, device), None)
        d, L = self.dim, int(prompt_length)
        g, beta = self._gaussian_draw(batch, L, generator, dtype, device)  # [D, B, L+1]; β/τ [B, d], times τ in ``mixer``
        frame, query_map, mixer = self._whitening(dtype, device)
        y = g[d].view(batch, 1, L + 1)  # y = (Cᵀβ)ᵀ g_x + σ g_y, one product
        y.baddbmm_((beta @ mixer).unsqueeze(1), g[:d].permute(1, 0, 2), beta=self.noise_variance**0.5)
        tokens = g.permute(1, 2, 0)  # [B, L+1, D]
        query = tokens[:, L] @ query_map  # z_q = (C g_q, 0)
        target = tokens[:, L, d].clone()  # y_q = βᵀx_q + σε_q
        return query, tokens[:, :L], target, frame

    def _whitening(self, dtype, device):
        """(T = diag(C, 1), the query's map (g_q, ·) ↦ (C g_q, 0) as a right factor, τ·C) in ``dtype`` on ``device``
        (cached: training draws in one dtype)."""
        key = ("whitening", dtype, str(device))
        if key not in self._chol_cache:
            d, chol = self.dim, self._chol
            frame = torch.eye(d + 1, dtype=torch.float64, device="cpu")  # built on the host, beside C
            frame[:d, :d] = chol
            query_map = torch.zeros(d + 1, d + 1, dtype=torch.float64, device="cpu")
            query_map[:d, :d] = chol.T
            mixer = chol * self.task_variance**0.5
            self._chol_cache[key] = tuple(t.to(dtype=dtype, device=device) for t in (frame, query_map, mixer))
        return self._chol_cache[key]

    def _chol_in(self, dtype, device):
        """C in ``dtype`` on ``device`` (cached: training draws in one dtype)."""
        key = (dtype, str(device))
        if key not in self._chol_cache:
            self._chol_cache[key] = self._chol.to(dtype=dtype, device=device)
        return self._chol_cache[key]

    def _sample_bounded(self, batch: int, prompt_length: int, generator, dtype, device):
        """Rademacher or uniform covariates x [B, L+1, d], then the noise [B, L+1] and β [B, d] from the same
        generator; y = βᵀx + σε; token L is the query (docs/theory.md#bounded-token-risk)."""
        d, L = self.dim, int(prompt_length)
        stored = torch.empty(d + 1, batch, L + 1, dtype=dtype, device=device)  # feature-major, as the Gaussian draw
        raw, noise, beta = self._bounded_draw(batch, L, generator, dtype, device)
        x = stored[:d]  # [d, B, L+1]; the numbers are drawn [B, L+1, d] and mapped elementwise, in place
        self._bounded_covariates(x.copy_(raw.permute(2, 0, 1)))
        y = stored[d].view(batch, 1, L + 1)
        y.copy_(noise.unsqueeze(1))
        beta = beta * self.task_variance**0.5  # [B, d]
        y.baddbmm_(beta.unsqueeze(1), x.permute(1, 0, 2), beta=self.noise_variance**0.5)  # y = βᵀx + σε, one product
        tokens = stored.permute(1, 2, 0)  # [B, L+1, D]
        query = tokens[:, L].clone()
        target = query[:, d].clone()
        query[:, d] = 0.0
        return query, tokens[:, :L], target, beta


def regression_task(icl: dict) -> RegressionTask:
    """The task of config section ``icl``: Λ_ij = covariance_rho^|i−j| in ``dim`` dimensions, τ², σ², and its
    ``token_measure`` (default gaussian; the bounded measures need covariance_rho = 0)."""
    cov = toeplitz_covariance(int(icl["dim"]), float(icl["covariance_rho"]), dtype=torch.float64)
    return RegressionTask(cov, icl["task_variance"], icl["noise_variance"], icl.get("token_measure", "gaussian"))


def ridge_predictions(query: torch.Tensor, prompt: torch.Tensor, ridge: float) -> torch.Tensor:
    """Posterior-mean (ridge, λ = σ²/τ²) predictions x_qᵀ(XᵀX + λI)⁻¹Xᵀy, the Bayes predictor (docs/theory.md#bayes-risk).

    query [B, D], prompt [B, L, D] → [B].
    """
    X, y = prompt[..., :-1], prompt[..., -1]  # [B, L, d], [B, L]
    d = X.shape[-1]
    gram = X.transpose(-1, -2) @ X + ridge * torch.eye(d, dtype=X.dtype, device=X.device)  # [B, d, d]
    beta_hat = torch.linalg.solve(gram, (X.transpose(-1, -2) @ y.unsqueeze(-1)))  # [B, d, 1]
    return (query[:, None, :-1] @ beta_hat).reshape(-1)  # [B]
