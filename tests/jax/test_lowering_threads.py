"""Programs lowered in several threads at once get the same call identities and the same chaining
as when lowered one after another (the lowering's per-module state is per thread)."""

import re
import threading

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import mlir
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

try:
    from jax.extend.core import Primitive
except ImportError:  # older JAX
    from jax.core import Primitive

import jax_rccl

_gate = {"entered": threading.Event(), "release": threading.Event(), "armed": False}

pause_p = Primitive("jax_rccl_test_pause")
pause_p.def_abstract_eval(lambda x: x)


def _pause_lowering(ctx, x):
    if _gate["armed"]:
        _gate["entered"].set()
        assert _gate["release"].wait(60), "the other thread never finished its lowering"
    return [x]


mlir.register_lowering(pause_p, _pause_lowering)


def _sites(text: str) -> list[str]:
    return re.findall(r"call_site = (\d+)", text)


def _programs():
    mesh = Mesh(np.array(jax.devices()[:4]), ("x",))

    def first(a):  # two collectives with a pause lowered between them
        return jax_rccl.pmax(pause_p.bind(jax_rccl.psum(a, "x")), "x")

    def second(a):
        return jax_rccl.psum(a, "x") * 2.0

    def jit(f):
        return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=P("x")))

    return jit(first), jit(second)


def test_lowering_in_two_threads_interleaved():
    first, second = _programs()
    x = jnp.arange(8.0)
    alone = [first.lower(x).as_text(), second.lower(x).as_text()]
    assert len(_sites(alone[0])) == 2 and len(_sites(alone[1])) == 1

    first, second = _programs()  # fresh functions: nothing cached
    out: dict = {}
    _gate["armed"] = True
    try:
        t = threading.Thread(target=lambda: out.update(first=first.lower(x).as_text()))
        t.start()
        assert _gate["entered"].wait(60)
        _gate["armed"] = False
        out["second"] = second.lower(x).as_text()  # lowered while `first` is half-way
        _gate["release"].set()
        t.join(60)
    finally:
        _gate["armed"] = False
        _gate["release"].set()
    assert _sites(out["first"]) == _sites(alone[0])
    assert _sites(out["second"]) == _sites(alone[1])
    # the same modules, the chaining of `first`'s second call to its first one included
    assert out["first"] == alone[0]
    assert out["second"] == alone[1]
    np.testing.assert_allclose(np.asarray(first(x)), np.tile([12.0, 16.0], 4))
    np.testing.assert_allclose(np.asarray(second(x)), np.tile([24.0, 32.0], 4))
