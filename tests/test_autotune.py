"""Per-machine attention kernels (largeprompt.kernel.autotune): correctness for every candidate, cache, lock, override.

No timing is asserted: where the choice matters, tuning is replaced by a stand-in timer.
Every test runs with XDG_CACHE_HOME in its own temporary folder.
"""
import json
import subprocess
import sys
import textwrap

import pytest
import torch

from largeprompt.io.provenance import provenance
from largeprompt.kernel import autotune, kernel_cache
from largeprompt.kernel.autotune import TunedMoments
from largeprompt.kernel.tilted_moments import AttentionKernel, TiltedMoments

F64 = torch.float64


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv(autotune.ENV_KERNEL, raising=False)
    autotune.forget()
    yield tmp_path / "xdg" / "largeprompt" / "attention_kernels.json"
    autotune.forget()


def stand_in_timer(fastest_index=1, calls=None):
    """A time_candidates replacement: candidate number ``fastest_index`` is the fastest; counts its calls."""

    def timer(kernels, *args, **kwargs):
        if calls is not None:
            calls.append(tuple(kernels))
        return {k: (0.5 if i == min(fastest_index, len(kernels) - 1) else 1.0 + i) for i, k in enumerate(kernels)}

    return timer


# ------------------------------------------------------------------------------------------
# results do not depend on the kernel beyond round-off


def reference_moments(tilt, tokens):
    """Untiled float64 softmax moments: weights materialised in one piece, mean [.., D], second moment [.., D, D]."""
    weights = torch.softmax(torch.einsum("...qd,...ld->...ql", tilt.double(), tokens.double()), dim=-1)
    mean = weights @ tokens.double()
    second = torch.einsum("...ql,...li,...lj->...qij", weights, tokens.double(), tokens.double())
    return mean, second - mean.unsqueeze(-1) * mean.unsqueeze(-2)


def round_off_bound(tilt, tokens, eps):
    """A bound on |tiled − untiled| for the mean, from the dtype's eps and the number of summed terms.

    With γ_n ≈ n·eps (eps covers the 1-ulp exp2 as well as ½-ulp arithmetic): a score, the D-term dot
    product of the log₂e-scaled tilt with z minus the reference, is off by ≤ γ_{D+2}(Σ_k|a_k z_k| + |r|)
    ≤ 2(D + 2)·eps·s_max, so each weight has relative error δ ≤ 2(D + 3)·eps·(1 + s_max). The weighted
    mean then moves by ≤ 2δ·max|z| (numerator and normaliser), and the sums add γ_N·max|z| with
    N = 3L + D + 8 (numerator and normaliser of L terms, at most one rescale per token, the division).
    The untiled reference rounds too: a factor 2. Worst case for every summation order, not tuned.
    """
    dim, length = tokens.shape[-1], tokens.shape[-2]
    s_max = torch.einsum("...qd,...ld->...ql", tilt.abs().double(), tokens.abs().double()).max().item()
    weight_error = 2 * (dim + 3) * eps * (1 + s_max)
    return 2 * (2 * weight_error + (3 * length + dim + 8) * eps) * tokens.abs().max().item()


def tiled_moments(tilt, tokens, kernel, second_moment, chunk):
    acc = TiltedMoments(tilt, second_moment, kernel)
    for start in range(0, tokens.shape[-2], chunk):
        acc.update(tokens[..., start : start + chunk, :])
    assert acc.kernel == kernel
    return acc.mean(), (acc.covariance() if second_moment else None)


REGIMES = {  # (prompts, queries, dim, second_moment, dtype, prompt_length)
    "shared prompt, 64 queries": (1, 64, 6, False, F64, 40_000),
    "shared prompt, float32": (1, 16, 3, False, torch.float32, 20_000),
    "8 prompts, 3 queries each, covariance": (8, 3, 2, True, F64, 12_000),
    "64 prompts, 1 query each, covariance": (64, 1, 2, True, F64, 3_000),
}


@pytest.mark.parametrize("regime", REGIMES)
def test_every_candidate_kernel_matches_the_untiled_reference(regime):
    prompts, queries, dim, second_moment, dtype, length = REGIMES[regime]
    gen = torch.Generator().manual_seed(7)
    tilt = torch.randn(prompts, queries, dim, generator=gen, dtype=F64).to(dtype)
    tokens = (1.5 * torch.randn(prompts, length, dim, generator=gen, dtype=F64) + 0.3).to(dtype)
    if prompts == 1:
        tilt, tokens = tilt[0], tokens[0]
    itemsize = torch.empty((), dtype=dtype).element_size()
    kernels = set(autotune.candidate_kernels(queries, prompts, dim, itemsize))  # this machine's caches
    kernels |= set(autotune.candidate_kernels(queries, prompts, dim, itemsize, {2: 32 << 10, 3: 1 << 20}))  # small
    assert {(k.token_major, k.base2) for k in kernels} == {(False, False), (False, True), (True, False), (True, True)}
    mean_ref, cov_ref = reference_moments(tilt, tokens)
    tol = round_off_bound(tilt, tokens, torch.finfo(dtype).eps)
    for kernel in sorted(kernels, key=str):
        mean, cov = tiled_moments(tilt, tokens, kernel, second_moment, chunk=4999)
        assert (mean.double() - mean_ref).abs().max().item() <= tol, (regime, str(kernel))
        if second_moment:  # Σ w z zᵀ/Σ w − m mᵀ: each term as the mean's bound, times max|z|
            cov_tol = 4 * tol * tokens.abs().max().item()
            assert (cov.double() - cov_ref).abs().max().item() <= cov_tol, (regime, str(kernel))


@pytest.mark.parametrize("base2", [False, True], ids=["exp", "exp2"])
@pytest.mark.parametrize("token_major", [False, True], ids=["query-major", "token-major"])
def test_both_storage_orders_and_bases_match_the_untiled_reference(token_major, base2):
    """Token-major and query-major storage, base e and base 2, give the same moments, overflow included."""
    gen = torch.Generator().manual_seed(11)
    for prompts, queries, length in ((1, 5, 3000), (6, 4, 2000)):
        tilt = torch.randn(prompts, queries, 3, generator=gen, dtype=F64)
        tilt[..., 0, 0] = 2000.0  # scores up to ±10⁴: the unchecked pass overflows and is redone
        tokens = 1.5 * torch.randn(prompts, length, 3, generator=gen, dtype=F64)
        kernel = AttentionKernel(TiltedMoments.MIN_TILE_TOKENS * prompts * queries, token_major, base2)
        acc = TiltedMoments(tilt, True, kernel)
        for start in range(0, length, 777):
            acc.update(tokens[:, start : start + 777])
        assert acc._token_major is token_major
        mean_ref, cov_ref = reference_moments(tilt, tokens)
        tol = round_off_bound(tilt, tokens, torch.finfo(F64).eps)
        assert (acc.mean() - mean_ref).abs().max().item() <= tol
        assert (acc.covariance() - cov_ref).abs().max().item() <= 4 * tol * tokens.abs().max().item()


@pytest.mark.parametrize("base2", [False, True], ids=["exp", "exp2"])
def test_overflow_inside_a_block_of_tiles_is_redone_tile_by_tile(base2):
    """Scores rising from −3000 to 3000 across one update of 20 tiles: the unchecked pass overflows, the redo rebases."""
    length = 5000
    t = torch.linspace(-1.0, 1.0, length, dtype=F64)
    tokens = torch.stack([t, torch.cos(40 * t), torch.sin(40 * t)], dim=-1)  # [L, 3]
    tilt = torch.tensor([[3000.0, 0.0, 0.0], [-3000.0, 1.0, 0.0], [1.0, 2.0, 3.0]], dtype=F64)
    mean, _ = tiled_moments(tilt, tokens, AttentionKernel(3 * TiltedMoments.MIN_TILE_TOKENS, False, base2), False, chunk=length)
    mean_ref, _ = reference_moments(tilt, tokens)
    assert torch.isfinite(mean).all()
    assert (mean - mean_ref).abs().max().item() <= round_off_bound(tilt, tokens, torch.finfo(F64).eps)


def test_candidates_come_from_the_cache_sizes():
    small = autotune.candidate_tiles(64, 1, 6, 8, {2: 512 << 10, 3: 32 << 20})
    large_l2 = autotune.candidate_tiles(64, 1, 6, 8, {2: 2 << 20, 3: 32 << 20})
    for tiles in (small, large_l2):
        assert tiles == sorted(tiles) and all(t & (t - 1) == 0 for t in tiles)
    # working set 8·(1 + 7/64) bytes per score: L2 … L3/2
    assert small[0] == 1 << 15 and small[-1] == 1 << 20 and large_l2[0] == 1 << 17
    # one prompt per query: every candidate a distinct tile in tokens, none below the minimum
    batched = autotune.candidate_tiles(1, 256, 2, 8, {2: 512 << 10, 3: 32 << 20})
    tokens = [max(TiltedMoments.MIN_TILE_TOKENS, t // 256) for t in batched]
    assert len(set(tokens)) == len(tokens) and min(tokens) == TiltedMoments.MIN_TILE_TOKENS


def test_cache_sizes_are_read_from_sysfs(tmp_path):
    for name, (level, kind, size) in {
        "index0": (1, "Data", "48K"), "index1": (1, "Instruction", "32K"),
        "index2": (2, "Unified", "2048K"), "index3": (3, "Unified", "105M"),
    }.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "level").write_text(f"{level}\n")
        (tmp_path / name / "type").write_text(f"{kind}\n")
        (tmp_path / name / "size").write_text(f"{size}\n")
    assert autotune.cache_sizes(str(tmp_path)) == {1: 48 << 10, 2: 2 << 20, 3: 105 << 20}
    assert autotune.cache_sizes(str(tmp_path / "missing")) == autotune.FALLBACK_CACHES


# ------------------------------------------------------------------------------------------
# the cache


def test_cache_round_trips_and_is_keyed_by_machine_and_regime(private_cache, monkeypatch):
    calls = []
    monkeypatch.setattr(autotune, "time_candidates", stand_in_timer(1, calls))
    kernel = autotune.attention_kernel(40, 1, 6, False, F64)
    expected = autotune.candidate_kernels(64, 1, 6, 8)[1]  # tuned at the bucket's 64 queries
    assert kernel == expected and len(calls) == 1
    assert autotune.kernel_sources() == {autotune.regime_key(40, 1, 6, False, F64): "tuned"}
    stored = json.loads(private_cache.read_text())
    assert stored["format"] == kernel_cache.CACHE_FORMAT
    assert stored["machines"][autotune.machine_key()][autotune.regime_key(64, 1, 6, False, F64)]["kernel"] == str(kernel)

    autotune.forget()  # a new process: the same bucket (33..64 queries) reads the cache
    assert autotune.attention_kernel(64, 1, 6, False, F64) == kernel and len(calls) == 1
    assert set(autotune.kernel_sources().values()) == {"cache"}
    for other in [(40, 1, 6, False, torch.float32), (200, 1, 6, False, F64), (40, 8, 6, False, F64),
                  (40, 1, 3, False, F64), (40, 1, 6, True, F64)]:  # dtype, query and prompt buckets, D, covariance
        autotune.attention_kernel(*other)
    assert len(calls) == 6
    monkeypatch.setattr(autotune, "machine_key", lambda: "another CPU | 64 cores | 1 threads | torch 9")
    autotune.forget()
    autotune.attention_kernel(64, 1, 6, False, F64)
    assert len(calls) == 7 and len(json.loads(private_cache.read_text())["machines"]) == 2


def test_kernels_print_and_parse_back():
    for kernel in autotune.candidate_kernels(64, 1, 6, 8):
        assert AttentionKernel.parse(str(kernel), autotune.default_kernel(1)) == kernel
    default = AttentionKernel(4096, True, False)
    assert AttentionKernel.parse("exp=2", default) == AttentionKernel(4096, True, True)
    assert AttentionKernel.parse(" tile = 512 , scores=query ", default) == AttentionKernel(512, False, False)
    for bad in ("tile=0", "tile=-3", "tile=many", "scores=diagonal", "exp=10", "speed=fast"):
        with pytest.raises(ValueError, match="tile|scores|exp"):
            AttentionKernel.parse(bad, default)


def test_regime_keys_bucket_the_counts():
    key = autotune.regime_key(41, 250, 2, True, F64)
    assert key == "attention/float64/cpu/D2/q64/p256/cov"
    assert autotune.regime_key(64, 129, 2, False, torch.float32) == "attention/float32/cpu/D2/q64/p256"
    assert autotune.regime_key(1, 1, 3, False, F64) == "attention/float64/cpu/D3/q1/p1"


@pytest.mark.parametrize("garbage", [b"\x00\xff not json", b'["a", "list"]', b'{"format": 1, "machines": 3}', b""])
def test_corrupt_cache_is_ignored_and_rewritten(private_cache, monkeypatch, garbage):
    private_cache.parent.mkdir(parents=True)
    private_cache.write_bytes(garbage)
    monkeypatch.setattr(autotune, "time_candidates", stand_in_timer(0))
    kernel = autotune.attention_kernel(64, 1, 6, False, F64)
    stored = json.loads(private_cache.read_text())
    assert stored["machines"][autotune.machine_key()][autotune.regime_key(64, 1, 6, False, F64)]["kernel"] == str(kernel)


def test_invalid_cache_entry_is_retuned(private_cache, monkeypatch):
    key, regime = autotune.machine_key(), autotune.regime_key(64, 1, 6, False, F64)
    private_cache.parent.mkdir(parents=True)
    for bad in (-4, "4096", True, None, "tile=0,scores=query", "tile=4096,exp=3"):
        private_cache.write_text(json.dumps({"format": kernel_cache.CACHE_FORMAT, "machines": {key: {regime: {"kernel": bad}}}}))
        autotune.forget()
        monkeypatch.setattr(autotune, "time_candidates", stand_in_timer(2))
        assert autotune.attention_kernel(64, 1, 6, False, F64) == autotune.candidate_kernels(64, 1, 6, 8)[2]


CONCURRENT = textwrap.dedent(
    """
    import json, os, pathlib, random, sys, time
    import torch
    from largeprompt.kernel import autotune

    def timer(kernels, *args, **kwargs):  # each process would pick a different kernel if it tuned on its own
        time.sleep(0.5)  # hold the lock long enough for the other process to want it
        rng = random.Random()
        return {k: rng.random() for k in kernels}

    autotune.time_candidates = timer
    barrier = pathlib.Path(sys.argv[1])  # start together, once both have imported torch
    (barrier / f"ready-{os.getpid()}").touch()
    deadline = time.time() + 120
    while len(list(barrier.glob("ready-*"))) < 2 and time.time() < deadline:
        time.sleep(0.005)
    kernel = autotune.attention_kernel(64, 1, 6, False, torch.float64)
    print(json.dumps({"kernel": str(kernel), "source": autotune.kernel_sources()}))
    """
)


def test_concurrent_first_use_agrees(private_cache, tmp_path):
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    procs = [
        subprocess.Popen([sys.executable, "-c", CONCURRENT, str(barrier)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert results[0]["kernel"] == results[1]["kernel"]
    sources = sorted(next(iter(r["source"].values())) for r in results)
    assert sources == ["cache", "tuned"]  # the first writer wins, the other re-reads
    stored = json.loads(private_cache.read_text())["machines"]
    assert [e["kernel"] for m in stored.values() for e in m.values()] == [results[0]["kernel"]]


# ------------------------------------------------------------------------------------------
# the override and the provenance


def test_environment_override_wins_and_skips_tuning(private_cache, monkeypatch):
    monkeypatch.setattr(autotune, "time_candidates", stand_in_timer(0))
    autotune.attention_kernel(64, 1, 6, False, F64)  # cache a tuned kernel first
    autotune.forget()

    def no_tuning(*args, **kwargs):
        raise AssertionError("the override must not tune")

    monkeypatch.setattr(autotune, "time_candidates", no_tuning)
    monkeypatch.setenv(autotune.ENV_KERNEL, "tile=5000,exp=2")
    acc = TunedMoments(torch.randn(64, 6, dtype=F64))
    acc.update(torch.randn(1000, 6, dtype=F64))
    expected = AttentionKernel(5000, autotune.default_kernel(64).token_major, True)  # scores: the default order
    assert acc.kernel == expected and autotune.attention_kernel(64, 1, 6, False, F64) == expected
    assert set(autotune.kernel_sources().values()) == {"env"}
    for bad in ("zero", "tile=0", "tile=-3", "scores=diagonal"):
        monkeypatch.setenv(autotune.ENV_KERNEL, bad)
        with pytest.raises(ValueError, match=autotune.ENV_KERNEL):
            autotune.attention_kernel(64, 1, 6, False, F64)


def test_override_without_a_cache_writes_nothing(private_cache, monkeypatch):
    monkeypatch.setenv(autotune.ENV_KERNEL, "tile=65536")
    TunedMoments(torch.randn(4, 3, dtype=F64)).update(torch.randn(100, 3, dtype=F64))
    assert not private_cache.parent.exists()


def test_provenance_records_the_kernels_used(monkeypatch):
    monkeypatch.setenv(autotune.ENV_KERNEL, "tile=32768,scores=token,exp=2")
    assert provenance("some_rule", {})["attention_kernels"] == {}
    acc = TunedMoments(torch.randn(250, 1, 2, dtype=F64), second_moment=True)
    acc.update(torch.randn(250, 10, 2, dtype=F64))
    assert provenance("some_rule", {})["attention_kernels"] == {
        "attention/float64/cpu/D2/q1/p256/cov": "tile=32768,scores=token,exp=2"}


def test_a_recorded_kernel_reproduces_its_bits(monkeypatch):
    """The same kernel gives the same bits; another may not, but agrees to round-off (module doc of autotune)."""
    gen = torch.Generator().manual_seed(5)
    tilt, tokens = torch.randn(64, 6, generator=gen, dtype=F64), torch.randn(30_000, 6, generator=gen, dtype=F64)
    runs = {}
    for text in ("tile=65536,scores=query,exp=2", "tile=65536,scores=query,exp=2", "tile=131072,scores=token,exp=e"):
        autotune.forget()
        monkeypatch.setenv(autotune.ENV_KERNEL, text)
        acc = TunedMoments(tilt)
        acc.update(tokens)
        runs.setdefault(text, []).append(acc.mean())
    same = runs["tile=65536,scores=query,exp=2"]
    assert torch.equal(same[0], same[1])
    other = runs["tile=131072,scores=token,exp=e"][0]
    assert (other - same[0]).abs().max().item() <= round_off_bound(tilt, tokens, torch.finfo(F64).eps)
