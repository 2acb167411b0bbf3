"""jax.export of programs holding jax_rccl collectives.

jax_rccl's custom calls have a versioned contract (the `abi_version` attribute, see
`jax_rccl.lowering.ABI_VERSION`): a newer jax_rccl runs the calls of every older version, so
importing jax_rccl registers its targets with jax.export as stable, and programs export with no
``disabled_checks``::

    exp = jax.export.export(jax.jit(f))(*args)
    blob = exp.serialize()
    jax.export.deserialize(blob).call(*args)

`export_checks()` (the ``disabled_checks`` naming every target, which earlier releases needed)
still works.

The serialized program holds the attributes of each call (replica groups of physical device
ids, the call's identity, overrides), so it is called on the devices it was exported for, by a
process with the same jax_rccl release installed (docs/sharp-bits.md).
"""

from __future__ import annotations

import jax

from jax_rccl import _compat as compat
from jax_rccl import _docs, _ffi, _jax_rccl


def target_names() -> tuple[str, ...]:
    """Every custom-call target of the jax_rccl runtime, sorted."""
    names = set(_ffi.TARGETS)
    names |= {n for n in _jax_rccl.cpu_ffi_targets() if n.startswith("jax_rccl_")}
    return tuple(sorted(names))


def register_stable() -> None:
    """Registers every jax_rccl target with jax.export as one whose ABI stays stable."""
    compat.register_stable_custom_call_targets(target_names())


@_docs.fill
def export_checks() -> list[jax.export.DisabledSafetyCheck]:
    """The ``disabled_checks`` that earlier releases needed for :func:`jax.export.export` to
    serialize jax_rccl's custom calls (one ``DisabledSafetyCheck.custom_call`` per target).

    Importing jax_rccl now registers its targets as stable, so programs export without it;
    passing it still works (add your own checks to the list).

    Returns:
        A list of ``jax.export.DisabledSafetyCheck``.

    Example:
        {example_psum}
        >>> x = jax.device_put(np.arange(8.0), jax.NamedSharding(mesh, P("i")))
        >>> exp = jax.export.export(f, disabled_checks=jr.export_checks())(x)
        >>> print(jax.export.deserialize(exp.serialize()).call(x))
        [28. 28. 28. 28. 28. 28. 28. 28.]
    """
    return [jax.export.DisabledSafetyCheck.custom_call(name) for name in target_names()]
