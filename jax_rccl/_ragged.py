"""ragged_all_to_all: jax.lax's signature over the runtime's point-to-point path.

One primitive, ``ragged_all_to_all_p`` (operand, output, input_offsets, send_sizes,
output_offsets, recv_sizes -> [result]), with its abstract eval, batching, JVP, transpose and
lowering here. Slice i of K (K a multiple of the group size n, spd = K / n slices per peer) of
every rank goes to rank i // spd: rows [input_offsets[i], +send_sizes[i]) of its operand land at
rows [output_offsets[i], +send_sizes[i]) of that rank's result; the result is ``output`` with
every received slice written in.

Lowering (CPU): the four index arrays, converted to one integer type, travel through one
jax_rccl all_gather (every rank then holds every rank's offsets and sizes: a table of n x 4K),
then ``jax_rccl_ragged_all_to_all`` takes (operand[N, R], output[M, R], table) and returns the
result, aliased to ``output``. Its plan (built once) has per peer and slice one send and one
receive of the largest transfer, min(N, M) rows; each execution reads the table and moves only
the rows the sizes name (ffi/handlers/ragged.h). Every rank checks the whole table the same
way, so a bad entry (a negative value, a slice past the operand or the output, send_sizes
disagreeing with the receiver's recv_sizes) fails the call on every rank with the same message,
never a partial write (on GPUs the kernels check the table and the next call raises). Lowered
for a platform other than CPU, CUDA and ROCM it raises NotImplementedError.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_rccl import _compat as compat
from jax_rccl import _docs
from jax_rccl import api as A
from jax_rccl import lowering as L
from jax_rccl import primitives as P

mlir = compat.mlir
ir = compat.ir
hlo = compat.hlo

__all__ = ["ragged_all_to_all", "ragged_all_to_all_p"]

_FIELDS = ("input_offsets", "send_sizes", "output_offsets", "recv_sizes")
#: Element types narrower than a byte have no row layout the runtime can move.
_SUB_BYTE = frozenset({"int2", "uint2", "int4", "uint4", "float4_e2m1fn"})

ragged_all_to_all_p = P._defprim("ragged_all_to_all")


@_docs.fill
def ragged_all_to_all(
    operand,
    output,
    input_offsets,
    send_sizes,
    output_offsets,
    recv_sizes,
    *,
    axis_name,
    axis_index_groups=None,
):
    """Send ragged slices of ``operand`` to the devices of ``axis_name``, as
    :func:`jax.lax.ragged_all_to_all`.

    With n devices in the group and K entries in each index array (K a multiple of n, K / n slices
    per peer), slice i of this device, rows ``[input_offsets[i], input_offsets[i] +
    send_sizes[i])`` of ``operand``, goes to the device of index ``i // (K / n)`` and lands at rows
    ``[output_offsets[i], output_offsets[i] + send_sizes[i])`` of its result.

    Args:
        operand: the array whose rows (leading dimension) are sent.
        output: the array the received rows are written into (its other rows are kept); the same
            trailing dimensions and dtype as ``operand``.
        input_offsets, send_sizes: integer arrays [K]: where each slice starts in ``operand`` and
            how many rows it has.
        output_offsets: integer array [K]: where slice i lands in its receiver's result.
        recv_sizes: integer array [K]: the rows this device receives from each sender's slice;
            equal to what the sender sends (``send_sizes`` is ``all_to_all(recv_sizes,
            tiled=True)``).
        axis_name: a mesh axis name, or a tuple of names (keyword-only).
        axis_index_groups: optional list of lists of axis indices, all of one size, covering every
            index once.

    Returns:
        ``output`` with every received slice written in.

    Differences from jax.lax.ragged_all_to_all:
        it runs on CPU (jax.lax's lowers on GPUs only),
        under jax.vmap, jvp and grad; a slice past the operand or the output, a negative offset
        or size, or sizes that disagree fail the call on every device with a message naming the
        rank and the slice, never a partial write.

    Example:
        {example_run}
        >>> import jax.numpy as jnp
        >>> def f(x):  # every device sends its one row to device 0, which stacks them in order
        ...     k = jax.lax.axis_index("i")
        ...     to_0 = jnp.array([1, 0, 0, 0, 0, 0, 0, 0])
        ...     return jr.ragged_all_to_all(
        ...         x, jnp.zeros((8, 1)), input_offsets=jnp.zeros(8, int), send_sizes=to_0,
        ...         output_offsets=jnp.full(8, k), recv_sizes=jnp.full(8, k == 0, int),
        ...         axis_name="i")
        >>> print(run(f)(np.arange(8.0).reshape(8, 1))[:8, 0])  # device 0's result
        [0. 1. 2. 3. 4. 5. 6. 7.]
    """
    api = "ragged_all_to_all"
    axes = A._axes(axis_name, api)
    groups, n = A._groups(axis_index_groups, axes, api)
    operand = A._pvary(jnp.asarray(operand), axes)
    output = A._pvary(jnp.asarray(output), axes)
    idx = [jnp.asarray(v) for v in (input_offsets, send_sizes, output_offsets, recv_sizes)]
    (out,) = ragged_all_to_all_p.bind(
        operand, output, *idx, axes=axes, groups=groups, axis_size=n, tuning=A._tuning()
    )
    return out


# --- abstract eval ------------------------------------------------------------------------------


def _abstract_eval(operand, output, *index_avals, axes, groups, axis_size, tuning):
    del groups, tuning
    api = "jax_rccl.ragged_all_to_all"
    P.check_axis_names(axes, api)
    compat.check_unreduced([operand, output], axes, api)
    if operand.ndim < 1 or output.ndim < 1:
        raise ValueError(
            f"{api}: operand and output need a leading (row) axis; got shapes {operand.shape} "
            f"and {output.shape}"
        )
    if operand.shape[1:] != output.shape[1:]:
        raise ValueError(
            f"{api}: operand and output must agree after the leading axis; got shapes "
            f"{operand.shape} and {output.shape}"
        )
    if operand.dtype != output.dtype:
        raise TypeError(
            f"{api}: operand and output must have one dtype; got {operand.dtype} and {output.dtype}"
        )
    if np.dtype(operand.dtype).name in _SUB_BYTE:
        raise TypeError(f"{api}: dtype {operand.dtype} is narrower than a byte; not supported")
    for name, a in zip(_FIELDS, index_avals, strict=True):
        if not jnp.issubdtype(a.dtype, np.integer):
            raise ValueError(f"{api}: {name} must have an integer dtype, got {a.dtype}")
        if a.ndim != 1 or a.shape[0] < 1:
            raise ValueError(
                f"{api}: {name} must be rank 1 with a positive size, got shape {a.shape}"
            )
    lengths = {name: a.shape[0] for name, a in zip(_FIELDS, index_avals, strict=True)}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"{api}: the offsets and sizes must have one length, got {lengths}")
    k = index_avals[0].shape[0]
    if k % axis_size:
        raise ValueError(
            f"{api}: the offsets and sizes have length {k}, not a multiple of the group size "
            f"{axis_size} (each device sends K / {axis_size} slices to each device)"
        )
    out = output.update(weak_type=False)
    if compat.check_vma_enabled():
        mesh = compat.manual_axes()
        vma = compat.varying(output) | compat.varying(operand) | {a for a in axes if a in mesh}
        out = compat.with_varying(out, vma)
    return [out], compat.named_axis_effects(axes)


ragged_all_to_all_p.def_effectful_abstract_eval(_abstract_eval)


# --- batching: a vmapped axis that is not one of the collective's ---------------------------


def _batch(axis_data, vals, dims, *, axes, groups, axis_size, tuning):
    """The batch folds into the slices: element b's slice i becomes slice i * B + b (same
    destination), its rows offset by b times the rows of one element."""
    if axis_data.name in axes:
        raise NotImplementedError(
            "jax_rccl.ragged_all_to_all over an axis bound by jax.vmap "
            f"({axis_data.name!r} in axis_name {tuple(axes)}) is not supported (nor by "
            "jax.lax); use a shard_map mesh axis"
        )
    params = dict(axes=axes, groups=groups, axis_size=axis_size, tuning=tuning)
    if all(d is compat.not_mapped for d in dims):
        return ragged_all_to_all_p.bind(*vals, **params), [compat.not_mapped]
    size = int(axis_data.size)
    operand, output = (P._batch_first(v, d, size) for v, d in zip(vals[:2], dims[:2], strict=True))
    n_rows, m_rows = operand.shape[1], output.shape[1]

    def slices_major(v, d):  # v[K] or batched -> [K, B]
        if d is compat.not_mapped:
            return lax.broadcast_in_dim(v, (v.shape[0], size), (0,))
        return P._moveaxis(v, d, 1)

    in_off, send, out_off, recv = (
        slices_major(v, d) for v, d in zip(vals[2:], dims[2:], strict=True)
    )
    b = lax.broadcasted_iota(in_off.dtype, in_off.shape, 1)
    in_off = in_off + b * np.asarray(n_rows, in_off.dtype)
    b = lax.broadcasted_iota(out_off.dtype, out_off.shape, 1)
    out_off = out_off + b * np.asarray(m_rows, out_off.dtype)
    flat = [v.reshape(-1) for v in (in_off, send, out_off, recv)]
    (y,) = ragged_all_to_all_p.bind(
        operand.reshape(-1, *operand.shape[2:]),
        output.reshape(-1, *output.shape[2:]),
        *flat,
        **params,
    )
    return [y.reshape(size, m_rows, *y.shape[1:])], [0]


compat.batching.fancy_primitive_batchers[ragged_all_to_all_p] = _batch


# --- JVP and transpose: linear in (operand, output), offsets and sizes fixed ---------------------


def _jvp(primals, tangents, **params):
    outs = ragged_all_to_all_p.bind(*primals, **params)
    d_operand, d_output = tangents[:2]
    if type(d_operand) is compat.Zero and type(d_output) is compat.Zero:
        return outs, [compat.tangent_zero(outs[0])]
    d_operand = compat.instantiate_zeros(d_operand)
    d_output = compat.instantiate_zeros(d_output)
    return outs, ragged_all_to_all_p.bind(d_operand, d_output, *primals[2:], **params)


def _transpose(cts, operand, output, in_off, send, out_off, recv, *, axes, groups, **params):
    """The cotangent of `operand` travels back along the same slices (the receivers send the
    rows they got); `output`'s is the cotangent with every received row zeroed."""
    (t,) = cts
    want_operand = compat.is_undefined_primal(operand)
    want_output = compat.is_undefined_primal(output)
    if type(t) is compat.Zero:
        return [
            compat.ct_zero(operand) if want_operand else None,
            compat.ct_zero(output) if want_output else None,
        ] + [None] * 4
    # Where my slices landed on their receivers, and where each arriving slice starts in mine.
    there = A.all_to_all(out_off, axes, 0, 0, tiled=True, axis_index_groups=groups)
    here = A.all_to_all(in_off, axes, 0, 0, tiled=True, axis_index_groups=groups)
    d_operand = None
    if want_operand:
        aval = operand.aval
        (d_operand,) = ragged_all_to_all_p.bind(
            t,
            jnp.zeros(aval.shape, aval.dtype),
            there,
            recv,
            here,
            send,
            axes=axes,
            groups=groups,
            **params,
        )
    d_output = None
    if want_output:
        rows = lax.broadcasted_iota(there.dtype, (t.shape[0], there.shape[0]), 0)
        got = jnp.any((rows >= there[None, :]) & (rows < (there + recv)[None, :]), axis=1)
        got = lax.broadcast_in_dim(got, t.shape, (0,))
        d_output = lax.select(got, jnp.zeros_like(t), t)
    return [d_operand, d_output] + [None] * 4


compat.ad.primitive_jvps[ragged_all_to_all_p] = _jvp
compat.ad.primitive_transposes[ragged_all_to_all_p] = _transpose


# --- lowering -----------------------------------------------------------------------------------


def _lower(ctx, operand, output, *index, axes, groups, axis_size, tuning):
    del axis_size
    in_aval, base_aval = ctx.avals_in[0], ctx.avals_in[1]
    out_aval = ctx.avals_out[0]
    if not all(compat.is_static_shape(a.shape) for a in ctx.avals_in):
        raise NotImplementedError(
            "jax_rccl.ragged_all_to_all: operand, output and index shapes must be static (got "
            f"{[tuple(map(str, a.shape)) for a in ctx.avals_in]}); export it with concrete "
            "shapes: its plan holds the largest transfer, min(operand rows, output rows)"
        )
    n_rows, m_rows = int(in_aval.shape[0]), int(base_aval.shape[0])
    row = int(np.prod(base_aval.shape[1:], dtype=np.int64))
    if m_rows * row == 0:  # nothing can arrive
        return [output]
    wide = any(np.dtype(a.dtype).itemsize > 4 for a in ctx.avals_in[2:])
    table_dtype = np.dtype(np.int64 if wide else np.int32)
    k = int(ctx.avals_in[2].shape[0])
    ity = mlir.dtype_to_ir_type(table_dtype)
    parts = [hlo.convert(ir.RankedTensorType.get([k], ity), v) for v in index]
    meta = hlo.concatenate(parts, ir.IntegerAttr.get(ir.IntegerType.get_signless(64), 0))
    rg = L.replica_groups(ctx, axes, groups)
    n = int(rg.shape[1])
    label = L.label("ragged_all_to_all", axes)
    sub = ctx.replace(
        avals_in=[compat.ShapedArray((4 * k,), table_dtype)],
        avals_out=[compat.ShapedArray((n * 4 * k,), table_dtype)],
    )
    (table,) = L.lower_collective(
        sub, meta, kind="all_gather", axes=axes, groups=groups, tuning=tuning, name=label
    )
    algorithm, protocol, _ = tuning
    elem = mlir.dtype_to_ir_type(base_aval.dtype)

    def rows_of(m):
        return ir.RankedTensorType.get([m, row], elem)

    operands = [hlo.reshape(rows_of(n_rows), operand), hlo.reshape(rows_of(m_rows), output), table]
    result_types = [rows_of(m_rows)]
    attrs = {
        "replica_groups": np.ascontiguousarray(rg.reshape(-1), dtype=np.int64),
        "group_size": np.int64(n),
        "op": np.int32(0),
        "premul": np.int32(0),
        "premul_value": np.float64(0.0),
        "root": np.int64(0),
        "perm": np.zeros((0,), np.int64),
        "algorithm": str(algorithm),
        "protocol": str(protocol),
        "name": label,
        "abi_version": np.int32(L.ABI_VERSION),
    }
    attrs["call_site"] = np.int64(
        L.call_identity(
            ctx,
            "ragged_all_to_all",
            attrs,
            [str(v.type) for v in operands],
            map(str, result_types),
        )
    )
    operands = L._after_previous_call(ctx, operands)
    call = mlir.custom_call(
        "jax_rccl_ragged_all_to_all",
        result_types=result_types,
        operands=operands,
        backend_config={key: mlir.ir_attribute(v) for key, v in attrs.items()},
        has_side_effect=False,
        api_version=4,
        operand_output_aliases={1: 0},
        operand_layouts=[L._row_major(v.type) for v in operands],
        result_layouts=[L._row_major(t) for t in result_types],
    )
    L._remember_call(ctx, call.results[0])
    return [hlo.reshape(mlir.aval_to_ir_type(ctx.module_context, out_aval), call.results[0])]


# One rule for every platform (jax.export's multi-platform lowering combines it like the other
# collectives'): the CPU runtime and the GPU runtime both run the ragged custom call.
L.register(ragged_all_to_all_p, _lower)
