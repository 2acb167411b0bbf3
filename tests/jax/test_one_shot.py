"""The CPU runtime's one-shot executions (ffi/cpu/comm.cc: RunOneShot, ffi/host/executor.cc:
OneShotEligible): a small Direct call of a group within one process runs once, by the last rank
to arrive, for every rank. Results are jax.lax's bit for bit, whatever runs them; the runtime's
counter says which calls ran one-shot; JAX_RCCL_CPU_ONESHOT sets the size (0: never)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import jax_rccl


def _mesh(shape=(8,), names=("i",)):
    return Mesh(np.array(jax.devices()[: int(np.prod(shape))]).reshape(shape), names)


def _run(lib_fn, x, mesh, spec=None):
    spec = P("i") if spec is None else spec
    f = jax.jit(jax.shard_map(lib_fn, mesh=mesh, in_specs=spec, out_specs=spec))
    return np.asarray(f(x))


def _one_shots(fn):
    before = jax_rccl.runtime_stats()["one_shots"]
    out = fn()
    return out, jax_rccl.runtime_stats()["one_shots"] - before


CASES = {
    "psum": (lambda v: jax_rccl.psum(v, "i"), lambda v: jax.lax.psum(v, "i")),
    "pmean": (lambda v: jax_rccl.pmean(v, "i"), lambda v: jax.lax.pmean(v, "i")),
    "pmax": (lambda v: jax_rccl.pmax(v, "i"), lambda v: jax.lax.pmax(v, "i")),
    "pmin": (lambda v: jax_rccl.pmin(v, "i"), lambda v: jax.lax.pmin(v, "i")),
    "all_gather": (
        lambda v: jax_rccl.all_gather(v, "i", tiled=True),
        lambda v: jax.lax.all_gather(v, "i", tiled=True),
    ),
    "psum_scatter": (
        lambda v: jax_rccl.psum_scatter(v, "i", tiled=True),
        lambda v: jax.lax.psum_scatter(v, "i", tiled=True),
    ),
}


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16, np.int32, np.float16])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("count", [8, 1000, 8 * 1024])
def test_small_calls_run_one_shot_with_jax_lax_results(case, dtype, count):
    mesh = _mesh()
    rng = np.random.default_rng(count)
    x = rng.standard_normal(8 * count).astype(np.float32).astype(dtype)
    ours, lax = CASES[case]
    got, shots = _one_shots(lambda: _run(ours, x, mesh))
    want = _run(lax, x, mesh)
    np.testing.assert_array_equal(got, want)
    assert shots == 1, f"{case} of {count} elements ran {shots} one-shot executions"


def test_every_group_of_a_2d_mesh_runs_one_shot_alone():
    mesh = _mesh((2, 4), ("a", "b"))
    x = np.arange(8 * 64, dtype=np.float32).reshape(8, 64)
    spec = P(("a", "b"))
    got, shots = _one_shots(
        lambda: _run(lambda v: jax_rccl.psum(v, "b"), x.reshape(-1), mesh, spec)
    )
    want = _run(lambda v: jax.lax.psum(v, "b"), x.reshape(-1), mesh, spec)
    np.testing.assert_array_equal(got, want)
    assert shots == 2  # the groups {a=0} and {a=1}, each run by its own last rank


def test_a_pytree_in_place_and_repeated():
    mesh = _mesh()
    xs = {"a": np.arange(8 * 5, dtype=np.float32), "b": np.arange(8 * 3, dtype=np.int32)}

    def body(t):
        return jax.tree.map(lambda v: jax_rccl.psum(v * 2, "i"), t)

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")))
    for _ in range(3):
        got, shots = _one_shots(lambda: jax.tree.map(np.asarray, f(xs)))
        for k, v in xs.items():
            want = np.tile((2 * v).reshape(8, -1).sum(0), 8)
            np.testing.assert_array_equal(got[k], want)
        assert shots >= 1


@pytest.mark.parametrize(
    "env",
    [
        {"JAX_RCCL_CPU_ONESHOT": "0"},  # off
        {"JAX_RCCL_CPU_ONESHOT": "64"},  # below the call's 4,000 bytes per rank
        {"JAX_RCCL_ALGO": "Ring"},  # not Direct
    ],
    ids=["off", "too_large", "ring"],
)
def test_calls_that_do_not_run_one_shot_still_match(monkeypatch, env):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    mesh = _mesh()
    x = np.random.default_rng(1).standard_normal(8 * 1000).astype(np.float32)
    ours, lax = CASES["psum"]
    got, shots = _one_shots(lambda: _run(ours, x, mesh))  # a new program: reads the settings
    if "JAX_RCCL_ALGO" in env:  # a ring adds in another order than jax.lax
        np.testing.assert_allclose(got, _run(lax, x, mesh), rtol=1e-5, atol=1e-5)
    else:  # Direct, as one-shot: the same sums in the same order
        np.testing.assert_array_equal(got, _run(lax, x, mesh))
    assert shots == 0


def test_a_premul_array_reads_each_rank_s_scalar_and_runs_as_before():
    mesh = _mesh()
    x = np.ones(8 * 16, np.float32)
    s = np.arange(8, dtype=np.float32)

    def body(v, k):
        return jax_rccl.all_reduce(v, "i", premul=k[0])

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("i"), P("i")), out_specs=P("i")))
    got, shots = _one_shots(lambda: np.asarray(f(x, s)))
    np.testing.assert_array_equal(got, np.full(8 * 16, s.sum(), np.float32))
    assert shots == 0  # a scalar that differs between ranks: each rank runs its own part


def test_the_setting_is_checked(monkeypatch):
    monkeypatch.setenv("JAX_RCCL_CPU_ONESHOT", "-1")
    mesh = _mesh()
    with pytest.raises(Exception, match="JAX_RCCL_CPU_ONESHOT"):
        _run(CASES["psum"][0], np.ones(8 * 4, np.float32), mesh)


P2P_CASES = {
    "ppermute_shift": (
        lambda v: jax_rccl.ppermute(v, "i", [(j, (j + 1) % 8) for j in range(8)]),
        lambda v: jax.lax.ppermute(v, "i", [(j, (j + 1) % 8) for j in range(8)]),
    ),
    "ppermute_swap_pairs": (
        lambda v: jax_rccl.ppermute(v, "i", [(j, j ^ 1) for j in range(8)]),
        lambda v: jax.lax.ppermute(v, "i", [(j, j ^ 1) for j in range(8)]),
    ),
    "all_to_all": (
        lambda v: jax_rccl.all_to_all(v, "i", 0, 0, tiled=True),
        lambda v: jax.lax.all_to_all(v, "i", 0, 0, tiled=True),
    ),
}


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16, np.int8])
@pytest.mark.parametrize("case", P2P_CASES)
@pytest.mark.parametrize("count", [8, 1000])
def test_point_to_point_calls_run_one_shot(case, dtype, count):
    """Every receive copied by the last rank to arrive from its sender's send."""
    mesh = _mesh()
    x = (np.arange(8 * count) % 97 - 48).astype(dtype)
    ours, lax = P2P_CASES[case]
    got, shots = _one_shots(lambda: _run(ours, x, mesh))
    np.testing.assert_array_equal(got, _run(lax, x, mesh))
    assert shots == 1


def test_point_to_point_in_place_reads_every_source_before_writing():
    """A ppermute whose results share their operands' buffers (donated, in place): each rank's
    result lands where another transfer reads its source, so the copies are staged."""
    mesh = _mesh()
    perm = [(j, (j + 1) % 8) for j in range(8)]
    with jax_rccl.config(in_place=True):
        f = jax.jit(
            jax.shard_map(
                lambda v: jax_rccl.ppermute(v, "i", perm),
                mesh=mesh,
                in_specs=P("i"),
                out_specs=P("i"),
            ),
            donate_argnums=0,
        )
        x = np.arange(8 * 64, dtype=np.float32)
        want = np.roll(x.reshape(8, 64), 1, axis=0).reshape(-1)
        got, shots = _one_shots(lambda: np.asarray(f(jnp.asarray(x))))
    np.testing.assert_array_equal(got, want)
    assert shots == 1


def test_a_rank_outside_the_permutation_keeps_every_rank_on_the_regular_path():
    mesh = _mesh()
    x = np.arange(8 * 16, dtype=np.float32)
    ours = lambda v: jax_rccl.ppermute(v, "i", [(0, 3), (3, 0), (5, 6)])  # noqa: E731
    lax = lambda v: jax.lax.ppermute(v, "i", [(0, 3), (3, 0), (5, 6)])  # noqa: E731
    got, shots = _one_shots(lambda: _run(ours, x, mesh))
    np.testing.assert_array_equal(got, _run(lax, x, mesh))
    assert shots == 0
