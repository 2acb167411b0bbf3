"""jax.export of programs holding jax_rccl collectives.

jax.export refuses to serialize custom calls whose targets it does not know to be stable,
unless each target is named in ``disabled_checks``. `export_checks()` names every jax_rccl
target::

    exp = jax.export.export(jax.jit(f), disabled_checks=jax_rccl.export_checks())(*args)
    blob = exp.serialize()
    jax.export.deserialize(blob).call(*args)

The serialized program holds the attributes of each call (replica groups of physical device
ids, the call's identity, overrides), so it is called on the devices it was exported for, by a
process with the same jax_rccl release installed (docs/sharp-bits.md).
"""

from __future__ import annotations

import jax

from jax_rccl import _ffi, _jax_rccl


def target_names() -> tuple[str, ...]:
    """Every custom-call target of the jax_rccl runtime, sorted."""
    names = set(_ffi.TARGETS)
    names |= {n for n in _jax_rccl.cpu_ffi_targets() if n.startswith("jax_rccl_")}
    return tuple(sorted(names))


def export_checks() -> list[jax.export.DisabledSafetyCheck]:
    """The `disabled_checks` that let `jax.export.export` serialize jax_rccl's custom calls
    (one `DisabledSafetyCheck.custom_call` per target); add your own to the list."""
    return [jax.export.DisabledSafetyCheck.custom_call(name) for name in target_names()]
