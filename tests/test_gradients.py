"""F5 closed-form Jacobians of T wrt U and V against torch autograd, finite L and L = ∞ (float64)."""
import pytest
import torch

from largeprompt.attention import finite_prompt_attention, infinite_prompt_attention, tilted_moments
from largeprompt.gradients import infinite_prompt_jacobians, jacobian_sq_errors, output_jacobians
from largeprompt.measures import make_measure, toeplitz_covariance
from largeprompt.seeding import stream_generator

F64 = torch.float64


def _params(dim=3, d_out=2):
    gen = stream_generator(3, "test/gradients/params", 0)
    U = 0.6 * torch.randn(dim, dim, generator=gen, dtype=F64)
    V = torch.randn(d_out, dim, generator=gen, dtype=F64)
    z_q = torch.randn(dim, generator=gen, dtype=F64)
    return U, V, z_q


@pytest.mark.parametrize("name", ["gaussian", "rademacher", "uniform"])
def test_finite_prompt_jacobians_match_autograd(name):
    U, V, z_q = _params()
    measure = make_measure(name, 3, cov=toeplitz_covariance(3, 0.4) if name == "gaussian" else None)
    tokens = measure.sample(300, stream_generator(3, f"test/gradients/tokens/{name}", 0))  # [L, D]
    def direct(u, v):  # T_L = V Σᵢ softmax_i(⟨U z_q, zᵢ⟩) zᵢ, plain softmax (not the streaming code)
        return v @ (torch.softmax(tokens @ (u @ z_q), dim=0) @ tokens)

    jac_u_auto, jac_v_auto = torch.autograd.functional.jacobian(direct, (U, V))  # [Dout, D, D], [Dout, Dout, D]
    torch.testing.assert_close(direct(U, V), finite_prompt_attention(z_q, tokens, U, V, chunk_size=64))
    mean, cov = tilted_moments(U @ z_q, tokens, chunk_size=64, second_moment=True)
    jac_u, jac_v = output_jacobians(mean, cov, z_q, V)
    torch.testing.assert_close(jac_u, jac_u_auto, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(jac_v, jac_v_auto, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ["gaussian", "rademacher", "uniform"])
def test_infinite_prompt_jacobians_match_autograd(name):
    U, V, z_q = _params()
    measure = make_measure(name, 3, cov=toeplitz_covariance(3, 0.4) if name == "gaussian" else None)
    jac_u_auto, jac_v_auto = torch.autograd.functional.jacobian(
        lambda u, v: infinite_prompt_attention(z_q, measure, u, v), (U, V)
    )
    jac_u, jac_v = infinite_prompt_jacobians(z_q, measure, U, V)
    torch.testing.assert_close(jac_u, jac_u_auto, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(jac_v, jac_v_auto, rtol=1e-10, atol=1e-12)


def test_gaussian_limit_jacobians_are_the_theory_formulas():
    """THEORY §E: ∂T_k/∂V_jl = δ_kj (m + S U z_q)_l and ∂T_k/∂U_ij = (V S)_ki (z_q)_j."""
    U, V, z_q = _params()
    S, m = toeplitz_covariance(3, 0.4), torch.tensor([0.2, -0.1, 0.3], dtype=F64)
    measure = make_measure("gaussian", 3, mean=m, cov=S)
    jac_u, jac_v = infinite_prompt_jacobians(z_q, measure, U, V)
    torch.testing.assert_close(jac_u, torch.einsum("ki,j->kij", V @ S, z_q))
    torch.testing.assert_close(jac_v, torch.einsum("kj,l->kjl", torch.eye(2, dtype=F64), m + S @ U @ z_q))


def test_sq_error_metric_is_frobenius_norm_of_jacobian_difference():
    U, V, z_q = _params()
    measure = make_measure("uniform", 3)
    tokens = measure.sample(200, stream_generator(3, "test/gradients/metric", 0))
    mean, cov = tilted_moments(U @ z_q, tokens, second_moment=True)
    a = U @ z_q
    ju_l, jv_l = output_jacobians(mean, cov, z_q, V)
    ju_i, jv_i = infinite_prompt_jacobians(z_q, measure, U, V)
    err_u, err_v = jacobian_sq_errors(mean, cov, measure.cgf_grad(a), measure.cgf_hess(a), z_q, V)
    torch.testing.assert_close(err_u, ((ju_l - ju_i) ** 2).sum())
    torch.testing.assert_close(err_v, ((jv_l - jv_i) ** 2).sum())


def test_gradient_fluctuation_constants_match_monte_carlo():
    """THEORY §E: L·E‖J_L − J_∞‖_F² → the Isserlis closed form, for U and V, at a fixed query (5 SE + O(1/L))."""
    import math

    from largeprompt.attention import streaming_tilted_moments
    from largeprompt.gradients import gaussian_jacobian_constants

    dim, L, R = 2, 1024, 4000
    S = toeplitz_covariance(dim, 0.5)
    V = torch.tensor([[1.0, 0.5], [-0.3, 2.0], [0.2, 0.1]], dtype=F64)
    z_q = torch.tensor([0.5, -0.3], dtype=F64)
    U = torch.eye(dim, dtype=F64)
    a = U @ z_q
    measure = make_measure("gaussian", dim, cov=S)
    mean, cov = streaming_tilted_moments(a.expand(R, dim), measure, L, stream_generator(3, "test/gradients/const", 0),
                                         chunk_size=L, second_moment=True, prompt_batch_shape=(R,))
    err_u, err_v = jacobian_sq_errors(mean, cov, measure.cgf_grad(a), measure.cgf_hess(a), z_q, V)  # [R]
    const_u, const_v = gaussian_jacobian_constants(a, S, z_q, V)
    for err, const in ((err_u * L, const_u), (err_v * L, const_v)):
        emp, se = float(err.mean()), float(err.std() / math.sqrt(R))
        assert abs(emp - float(const)) <= 5 * se + 5.0 * float(const) / L, (emp, float(const), se)
