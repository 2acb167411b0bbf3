"""Code nobody here wrote, used as it is, under jax_rccl.install(): flax.linen's BatchNorm with
an axis name, an optax data-parallel step whose gradient all-reduce is the one JAX inserts, and a
ring attention written the way public ones are. Each matches the same program without install()
bit for bit, and every collective of its compiled HLO is a jax_rccl call."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from collectives_util import mesh_1d, needs_runtime
from jax import lax
from jax.sharding import PartitionSpec as P
from test_lax_backend import assert_same, both, check_ours, hlo_of

import jax_rccl

pytestmark = needs_runtime

flax_linen = pytest.importorskip("flax.linen", reason="flax is in the test extras")
optax = pytest.importorskip("optax", reason="optax is in the test extras")


@pytest.fixture(autouse=True)
def _restore():
    yield
    jax_rccl.uninstall()


def _data(shape, seed=0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


class _Net(flax_linen.Module):
    @flax_linen.compact
    def __call__(self, x, train: bool = True):
        x = flax_linen.Dense(16)(x)
        x = flax_linen.BatchNorm(use_running_average=not train, axis_name="batch")(x)
        return flax_linen.Dense(4)(flax_linen.relu(x))


def _batchnorm_step(model, variables, x):
    y, updates = model.apply(variables, x, mutable=["batch_stats"])
    return y, updates["batch_stats"]


def test_flax_batchnorm_under_pmap():
    model = _Net()
    x = _data((8, 4, 5))
    variables = model.init(jax.random.PRNGKey(0), x[0])
    replicated = jax.tree_util.tree_map(lambda v: jnp.stack([v] * 8), variables)

    def make():
        return jax.pmap(functools.partial(_batchnorm_step, model), axis_name="batch")

    both(make, replicated, x)


def test_flax_batchnorm_under_shard_map():
    model = _Net()
    mesh = mesh_1d()
    mesh = jax.sharding.Mesh(mesh.devices, ("batch",))
    x = _data((32, 5))
    variables = model.init(jax.random.PRNGKey(0), x[:4])

    def make():
        return jax.jit(
            jax.shard_map(
                functools.partial(_batchnorm_step, model),
                mesh=mesh,
                in_specs=(P(), P("batch")),
                out_specs=(P("batch"), P()),
                check_vma=False,
            )
        )

    both(make, variables, x)


def test_optax_step_with_the_inserted_all_reduce():
    """Replicated parameters into shard_map: the gradient's all-reduce is the transpose JAX adds
    for their implicit broadcast; no collective is written in the step."""
    mesh = mesh_1d()
    params = {"w": _data((5, 3), 1), "b": jnp.zeros((3,), np.float32)}
    x, y = _data((32, 5), 2), _data((32, 3), 3)
    opt = optax.adam(1e-2)
    opt_state = opt.init(params)

    def local_loss(p, x, y):
        return jnp.mean((jnp.tanh(x @ p["w"] + p["b"]) - y) ** 2)

    def make():
        loss = jax.shard_map(
            lambda p, x, y: lax.pmean(local_loss(p, x, y), "i"),
            mesh=mesh,
            in_specs=(P(), P("i"), P("i")),
            out_specs=P(),
        )

        @jax.jit
        def step(p, s, x, y):
            value, g = jax.value_and_grad(loss)(p, x, y)
            updates, s = opt.update(g, s, p)
            return optax.apply_updates(p, updates), s, value

        return step

    ref, out = both(make, params, opt_state, x, y)
    # and a few more steps stay identical
    jax_rccl.uninstall()
    step = make()
    a = (params, opt_state)
    for _ in range(3):
        *a, _ = step(*a, x, y)
    with jax_rccl.install(platforms=("cpu",)):
        step = make()
        b = (params, opt_state)
        for _ in range(3):
            *b, _ = step(*b, x, y)
    assert_same(a, b)


# --- ring attention, as public implementations write it ------------------------------------------


def _ring_attention(q, k, v, axis_name):
    """Blockwise attention over a sequence split along `axis_name`: k and v travel around the
    ring with ppermute inside a scan; the number of steps is psum(1, axis_name)."""
    n = lax.psum(1, axis_name)  # the axis size, a Python int
    perm = [(j, (j + 1) % n) for j in range(n)]
    scale = 1.0 / np.sqrt(q.shape[-1])

    @jax.custom_vjp
    def attend(q, k, v):
        return _forward(q, k, v)[0]

    def _forward(q, k, v):
        def body(carry, _):
            o, m, l_, k, v = carry
            s = (q @ k.T) * scale
            m_new = jnp.maximum(m, s.max(-1))
            p = jnp.exp(s - m_new[:, None])
            corr = jnp.exp(m - m_new)
            l_new = l_ * corr + p.sum(-1)
            o = o * corr[:, None] + p @ v
            k, v = lax.ppermute(k, axis_name, perm), lax.ppermute(v, axis_name, perm)
            return (o, m_new, l_new, k, v), None

        init = (
            jnp.zeros_like(q),
            jnp.full(q.shape[:1], -jnp.inf, q.dtype),
            jnp.zeros(q.shape[:1], q.dtype),
            k,
            v,
        )
        (o, m, l_, _, _), _ = lax.scan(body, init, None, length=n)
        return o / l_[:, None], (q, k, v)

    def _backward(res, g):
        q, k, v = res
        # the gradient through the ring: recompute with autodiff of a plain scan
        _, vjp = jax.vjp(lambda q, k, v: _forward(q, k, v)[0], q, k, v)
        return vjp(g)

    attend.defvjp(_forward, _backward)
    return attend(q, k, v)


def test_ring_attention():
    mesh = mesh_1d()
    q, k, v = _data((64, 8), 4), _data((64, 8), 5), _data((64, 8), 6)

    def body(q, k, v):
        out = _ring_attention(q, k, v, "i")
        grads = jax.grad(lambda q, k, v: jnp.sum(_ring_attention(q, k, v, "i") ** 2), (0, 1, 2))(
            q, k, v
        )
        return out, grads

    spec = P("i")

    def make():
        return jax.jit(
            jax.shard_map(
                body,
                mesh=mesh,
                in_specs=(spec,) * 3,
                out_specs=(spec, (spec,) * 3),
                check_vma=False,
            )
        )

    ref, _ = both(make, q, k, v)
    # the reference: full attention on one device
    s = (np.asarray(q) @ np.asarray(k).T) / np.sqrt(8)
    p = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(
        np.asarray(ref[0]), (p / p.sum(-1, keepdims=True)) @ np.asarray(v), rtol=2e-5, atol=2e-5
    )
    with jax_rccl.install(platforms=("cpu",)):
        check_ours(hlo_of(make(), q, k, v))
