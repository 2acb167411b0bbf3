"""Lowering of jax_rccl's primitives to the runtime's custom calls.

ONE helper, `lower_collective`, emits `jax_rccl_<kind>` with every attribute of the FFI
contract (docs/architecture.md, "The FFI contract"): replica groups of PHYSICAL device ids
taken from the shard_map mesh, op, premul, root, perm, algorithm, protocol, the call's
identity (`call_site`: a hash of what is called and of its position in its module, the same in
every process that lowers the same program) and a name.
Operands and results travel as 1-D arrays (the primitives already put blocks where the runtime
wants them, so this is a free reshape), except all_reduce's, which keep their shapes (row-major)
so that a donated argument reaches the call without a bitcast; all_reduce results alias their
operands where the program may overwrite them (see `_is_kept_parameter` and
jax_rccl.config(in_place=...)). Zero-size leaves never reach the runtime. No tokens,
no side effect: every device runs the same schedule, and JAX keeps its fast dispatch path.

Platforms: cpu; cuda and rocm with the same rule where the installed build has the GPU runtime
(``JAX_RCCL_GPU=cuda|rocm``) and JAX a GPU backend, else NotImplementedError; when lowering for
jax.export, any of them (one rule for all, see `platform_rule`).
"""

from __future__ import annotations

import hashlib
import threading
import weakref

import numpy as np

from jax_rccl import _compat as compat
from jax_rccl import _ffi, _jax_rccl

mlir = compat.mlir
ir = compat.ir
hlo = compat.hlo

#: Platforms with a runtime behind the custom calls (GPU ones: in GPU builds).
SUPPORTED_PLATFORMS = ("cpu", "cuda", "rocm")
GPU_PLATFORMS = ("cuda", "rocm")

#: The version of the custom calls' contract this lowering writes (`abi_version`, read by
#: ffi/handlers/common.h: DecodeCallAttrs, which also runs every older version: a program
#: serialized with jax.export keeps running on newer jax_rccl releases).
ABI_VERSION = 2

#: The `op` attribute: each reduction op's code, as the native side numbers them.
OP_CODES = {op: i for i, op in enumerate(_jax_rccl.reduction_ops())}


def _runtime():
    """jax_rccl._ffi with its targets registered."""
    _ffi.ensure_registered()
    return _ffi


class ModuleState:
    """What the lowering keeps of ONE module being lowered, owned by that module (see
    `module_state`): the count of jax_rccl calls lowered into it so far (a call's position, part
    of its identity), the latest call of the innermost block (the chain that keeps calls in
    program order) and the tokens of jax.lax.psend under `jax_rccl.install()` with what each
    received. Several threads may lower different modules at once; one module is lowered by
    one thread."""

    def __init__(self) -> None:
        self.calls = 0
        self.last: tuple[object, object] | None = None  # (block, the call's first result)
        self.sent: dict = {}

    def next_position(self) -> int:
        self.calls += 1
        return self.calls - 1


# Module -> its state, for as long as the module lives (a new module never sees an old one's
# blocks or values, even at a reused address).
_states: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_states_lock = threading.Lock()


def module_state(ctx) -> ModuleState:
    """The state of the module `ctx` lowers into (made at its first jax_rccl call)."""
    module = ctx.module_context.module
    with _states_lock:
        state = _states.get(module)
        if state is None:
            state = _states[module] = ModuleState()
        return state


def module_platforms_of(ctx) -> tuple[str, ...]:
    """The platforms a rule lowers for: the rule's own (one branch of a multi-platform
    lowering) or the module's."""
    return tuple(ctx.platforms) if ctx.platforms else compat.module_platforms(ctx)


def gpu_runtime_for(ctx) -> bool:
    """Whether a GPU platform of `ctx` has a jax_rccl runtime here (always, when lowering for
    jax.export: the program is compiled where it is called)."""
    return compat.lowering_for_export(ctx) or bool(_runtime().gpu_platform())


def call_identity(ctx, kind, attrs, operand_types, result_types) -> int:
    """The `call_site` attribute: a 63-bit hash of what is called (kind, replica groups, every
    attribute, operand and result types) and of the call's position among the jax_rccl calls of
    its module. It depends on the program only, never on what else this process lowered before,
    so every process lowering the same program gives a call the same identity; the runtime stamps
    it on every step it sends and the receiver checks it (docs/multiprocess.md)."""
    h = hashlib.blake2b(digest_size=8)
    h.update(f"{kind}|{module_state(ctx).next_position()}".encode())
    for k in sorted(attrs):
        v = attrs[k]
        h.update(f"|{k}=".encode())
        h.update(v.tobytes() if isinstance(v, np.ndarray) else repr(v).encode())
    for t in (*operand_types, "->", *result_types):
        h.update(f"|{t}".encode())
    return int.from_bytes(h.digest(), "little") & ((1 << 63) - 1)


def replica_groups(ctx, axes, groups=None, *, sort=False) -> np.ndarray:
    """[n_groups, group_size] PHYSICAL device ids of the groups along mesh `axes`.

    Ranks follow JAX's order (the axis index over `axes`, major to minor as named); with
    axis_index_groups, group k of each mesh group holds those axis indices, in that order, and a
    group smaller than the largest ends in -1s (all_reduce's groups of unequal sizes).
    `sort` orders each group by mesh position (jax.lax.ppermute's convention).
    """
    axis_ctx = ctx.module_context.axis_context
    if not compat.is_spmd_context(axis_ctx):
        raise NotImplementedError(
            "jax_rccl collectives lower only inside jax.shard_map (got an axis context of type "
            f"{type(axis_ctx).__name__}; pmap is not supported)"
        )
    positions = compat.device_groups(axis_ctx, axes)
    if groups is not None:
        width = max(map(len, groups))
        positions = np.asarray(
            [[row[i] for i in g] + [-1] * (width - len(g)) for row in positions for g in groups]
        )
    if sort:
        positions = np.sort(positions, axis=1)
    ids = compat.mesh_device_ids(axis_ctx)
    return np.where(positions >= 0, ids[np.maximum(positions, 0)], -1)


# The first of three int64s {magic, partition id, device id} (ffi/handlers/common.h).
DEVICE_CHECK_MAGIC = 0x6A72636364657631


def _device_check(ctx):
    """The device check of a program lowered for jax.export: {magic, this partition's id, the
    physical device the lowering placed at that partition}. Its replica groups name the devices of
    the mesh it was exported with; called later on those devices in another mesh order, the
    runtime finds another device at the partition and fails instead of exchanging blocks with the
    wrong ranks."""
    i64 = ir.IntegerType.get_signless(64)
    ids = compat.mesh_device_ids(ctx.module_context.axis_context)
    table = mlir.ir_constant(np.ascontiguousarray(ids, dtype=np.int64))
    pid = hlo.convert(
        ir.RankedTensorType.get([1], i64),
        hlo.reshape(
            ir.RankedTensorType.get([1], ir.IntegerType.get_unsigned(32)), hlo.partition_id()
        ),
    )
    start = hlo.reshape(ir.RankedTensorType.get([], i64), pid)
    expected = hlo.DynamicSliceOp(table, [start], ir.DenseI64ArrayAttr.get([1])).result
    magic = mlir.ir_constant(np.array([DEVICE_CHECK_MAGIC], dtype=np.int64))
    return hlo.concatenate([magic, pid, expected], 0)


def _flat_type(aval):
    return ir.RankedTensorType.get([int(np.prod(aval.shape))], mlir.dtype_to_ir_type(aval.dtype))


def lower_collective(
    ctx,
    *args,
    kind,
    axes,
    groups=None,
    op="sum",
    premul=0,
    premul_value=0.0,
    root=0,
    perm=(),
    tuning=("", "", "auto"),
    n_leaves=None,
    sort_groups=False,
    name="",
):
    """Emit `jax_rccl_<kind>` over the leaves in `args` (the first `n_leaves`; after them, one
    premul scalar per leaf). Results have the shapes of ctx.avals_out."""
    n_leaves = len(args) if n_leaves is None else n_leaves
    leaves, scalars = args[:n_leaves], args[n_leaves:]
    in_avals, out_avals = ctx.avals_in[:n_leaves], ctx.avals_out
    live = [i for i, a in enumerate(out_avals) if not compat.definitely_empty(a.shape)]
    outs = [None] * len(out_avals)
    for i, a in enumerate(out_avals):
        if i not in live:
            if i < len(in_avals) and compat.definitely_empty(in_avals[i].shape):
                # An empty result made from the empty input (not a constant), so the input stays
                # used: Shardy's canonicalizer in jax 0.11 crashes on an unused shard_map input.
                outs[i] = mlir.reshape(ctx, leaves[i], a)
            else:
                outs[i] = mlir.full_like_aval(ctx, 0, a)
    if not live:
        return outs

    rg = replica_groups(ctx, axes, groups, sort=sort_groups)
    _runtime()  # registers the targets before the first call (the processes meet when it runs)
    algorithm, protocol, in_place = tuning
    if in_place not in ("auto", "on", "off"):
        raise ValueError(
            f"jax_rccl: in_place setting must be 'auto', 'on' or 'off', got {in_place!r}"
        )
    attrs = {
        "replica_groups": np.ascontiguousarray(rg.reshape(-1), dtype=np.int64),
        "group_size": np.int64(rg.shape[1]),
        "op": np.int32(OP_CODES[op]),
        "premul": np.int32(premul),
        "premul_value": np.float64(premul_value),
        "root": np.int64(root),
        "perm": np.asarray(perm, dtype=np.int64).reshape(-1),
        "algorithm": str(algorithm),
        "protocol": str(protocol),
        "name": name,
        "abi_version": np.int32(ABI_VERSION),
    }
    # all_reduce keeps its leaves' shapes (row-major): a reshape between a parameter and the call
    # would be a bitcast, across which XLA does not run the call in the parameter's buffer.
    # Leaves with symbolic dimensions (jax.export) keep theirs too: the runtime reads element
    # counts, which are known once the exported program is called and its shapes refined.
    static = all(compat.is_static_shape(a.shape) for a in (*in_avals, *out_avals))
    keep_shape = kind == "all_reduce" or not static
    operands = [
        leaves[i] if keep_shape else hlo.reshape(_flat_type(in_avals[i]), leaves[i]) for i in live
    ]
    if premul == 2:
        for i in live:
            scalar_aval = ctx.avals_in[n_leaves + i]
            operands.append(
                hlo.reshape(
                    ir.RankedTensorType.get([1], mlir.dtype_to_ir_type(scalar_aval.dtype)),
                    scalars[i],
                )
            )
    if compat.lowering_for_export(ctx) and compat.is_spmd_context(ctx.module_context.axis_context):
        operands.append(_device_check(ctx))
    result_types = [
        mlir.aval_to_ir_type(ctx.module_context, out_avals[i])
        if keep_shape
        else _flat_type(out_avals[i])
        for i in live
    ]
    attrs["call_site"] = np.int64(
        call_identity(ctx, kind, attrs, [str(v.type) for v in operands], map(str, result_types))
    )
    operands = _after_previous_call(ctx, operands)
    # Results of symbolic shape carry their shapes as operands (after the others) until the
    # exported program is called and its shapes refined.
    result_shapes = None
    if not static:
        result_shapes = [mlir.eval_dynamic_shape_as_tensor(ctx, out_avals[i].shape) for i in live]
    # An all_reduce runs in place (every algorithm reads an element's inputs before it writes
    # that element): each result may share its operand's buffer, so XLA reuses a temporary
    # operand (a gradient) for the result instead of allocating another buffer. Not an argument
    # of a function being lowered whose donation is unknown (shard_map's body, which JAX lowers
    # as a function of its own before its call site exists, or a checkpoint body): XLA would
    # copy an argument the caller keeps into a fresh buffer for the call to overwrite, where
    # without the alias the call writes a fresh result directly (a donated one then costs one
    # copy of the result into it). The jitted function's own arguments (pmap) carry their
    # donation, and a donated one is aliased.
    # jax_rccl.config(in_place=True) aliases every operand (for donated shard_map inputs),
    # in_place=False none.
    aliases = None
    if kind == "all_reduce" and in_place != "off":
        aliases = {
            j: j
            for j, i in enumerate(live)
            if in_place == "on" or not _is_kept_parameter(leaves[i])
        }
        aliases = aliases or None
    call = mlir.custom_call(
        f"jax_rccl_{kind}",
        result_types=result_types,
        operands=operands,
        backend_config={k: mlir.ir_attribute(v) for k, v in attrs.items()},
        has_side_effect=False,
        api_version=4,
        operand_output_aliases=aliases,
        operand_layouts=[_row_major(v.type) for v in operands],
        result_layouts=[_row_major(t) for t in result_types],
        result_shapes=result_shapes,
    )
    _remember_call(ctx, call.results[0])
    for i, r in zip(live, call.results, strict=True):
        outs[i] = (
            r
            if keep_shape
            else hlo.reshape(mlir.aval_to_ir_type(ctx.module_context, out_avals[i]), r)
        )
    return outs


def _block_argument(value):
    """`value` as an ir.BlockArgument, or None."""
    value = value.maybe_downcast()
    return value if isinstance(value, ir.BlockArgument) else None


def _row_major(t) -> tuple[int, ...]:
    return tuple(range(ir.RankedTensorType(t).rank - 1, -1, -1))


def _is_kept_parameter(value) -> bool:
    """Whether `value` is an argument of a public function being lowered (the jitted function,
    shard_map's body) that is not known to be donated, directly or through the region arguments
    of shard_map's manual computation. Anything else (a computed value, a donated argument, an
    argument of a nested private function, i.e. of an inner jit) is the program's to
    overwrite."""
    for _ in range(64):
        arg = _block_argument(value)
        if arg is None:
            return False
        parent = arg.owner.owner
        op = getattr(parent, "operation", parent)
        if op.name == "func.func":
            attrs = op.attributes
            vis = attrs["sym_visibility"] if "sym_visibility" in attrs else None
            if vis is not None and ir.StringAttr(vis).value != "public":
                return False
            if "arg_attrs" not in attrs:
                return True
            arg_attrs = ir.DictAttr(ir.ArrayAttr(attrs["arg_attrs"])[arg.arg_number])
            return not any(k in arg_attrs for k in ("jax.buffer_donor", "tf.aliasing_output"))
        if op.name != "sdy.manual_computation" or arg.arg_number >= len(op.operands):
            return False
        value = op.operands[arg.arg_number]
    return False


# --- program order ----------------------------------------------------------------------------
# XLA may run custom calls without a data dependency between them at the same time and in any
# order, differently on each device (and in each process). A collective blocks its thread until
# its peers arrive, so devices that started different collectives could wait on each other until
# the deadline. Each call therefore takes one more operand, a one-element slice of the previous
# jax_rccl call's first result in the same block (the runtime does not read it): collectives then
# run in program order on every device, as XLA runs its own. No token and no side effect: JAX's
# fast dispatch path stays. (An optimization barrier is not enough: XLA's CPU pipeline removes it.)

# The latest jax_rccl call lowered into the module (ModuleState.last). A block compares equal by
# address; the state lives and dies with its module, so a later module never sees it.


def _after_previous_call(ctx, operands):
    block = ir.InsertionPoint.current.block
    last = module_state(ctx).last
    if last is not None and last[0] == block:
        prev = last[1]
        t = ir.RankedTensorType(prev.type)
        one_type = ir.RankedTensorType.get([1], t.element_type)
        if t.rank == 0:
            return [*operands, hlo.reshape(one_type, prev)]
        # The first element (a leaf's shape may be symbolic: its first element always exists).
        idx = ir.DenseI64ArrayAttr.get
        one = hlo.SliceOp(prev, idx([0] * t.rank), idx([1] * t.rank), idx([1] * t.rank)).result
        if t.rank != 1:
            one = hlo.reshape(one_type, one)
        return [*operands, one]
    return operands


def _remember_call(ctx, value):
    module_state(ctx).last = (ir.InsertionPoint.current.block, value)


def label(api, axes):
    """The `name` attribute of a call: the public function and its axes (for messages)."""
    return f"{api} over {tuple(axes)!r}"


def platform_rule(prim, rule, supported=SUPPORTED_PLATFORMS, xla=None):
    """`rule` for every platform a module is lowered for: ONE rule, so that JAX's multi-platform
    lowering (jax.export(..., platforms=("cpu", "cuda"))) emits the custom calls once, not one
    copy per platform under a conditional (the calls then stay chained in program order; each
    platform registers the same targets). A platform outside `supported` (the platforms whose
    runtime has `prim`'s custom call) gets `xla(ctx, *args, **params)` (XLA's equivalent
    collective: a platform switch in a program lowered for both kinds), or NotImplementedError
    without one; a GPU platform needs the GPU runtime in this build, except when lowering for
    jax.export (the program is compiled where it is called)."""

    def ours(ctx, *args, **params):
        platforms = module_platforms_of(ctx)
        gpus = tuple(p for p in platforms if p in GPU_PLATFORMS)
        if gpus and not compat.lowering_for_export(ctx):
            if not _runtime().gpu_platform():
                raise NotImplementedError(
                    f"{prim.name}: the installed jax_rccl has no GPU runtime for platform(s) "
                    f"{gpus} (build it with JAX_RCCL_GPU=cuda or JAX_RCCL_GPU=rocm), or JAX "
                    "has no GPU backend"
                )
        return rule(ctx, *args, **params)

    def lowering(ctx, *args, **params):
        platforms = module_platforms_of(ctx)
        unsupported = [p for p in platforms if p not in supported]
        if not unsupported:
            return ours(ctx, *args, **params)
        if xla is None:
            raise NotImplementedError(
                f"{prim.name}: no jax_rccl runtime for platform(s) {tuple(unsupported)}; "
                f"supported: {tuple(supported)}"
            )
        rules = {p: (xla if p in unsupported else ours) for p in platforms}
        if len(unsupported) == len(platforms):
            return xla(ctx, *args, **params)
        return lower_per_platform(ctx, prim, rules, None, *args, **params)

    return lowering


def lower_per_platform(ctx, prim, rules, default, *args, **params):
    """`rules[p]` (else `default`) for each platform p of `ctx`: one rule inline when they all
    get the same, else JAX's switch on the platform index of a multi-platform lowering."""
    effects = getattr(ctx.jaxpr_eqn_ctx, "effects", set())
    # avals_out as a list: JAX's switch concatenates it to a list of token avals
    return mlir.lower_per_platform(
        ctx.replace(avals_out=list(ctx.avals_out)),
        prim.name,
        rules,
        default,
        effects,
        *args,
        **params,
    )


def register(prim, rule, supported=SUPPORTED_PLATFORMS, xla=None):
    """Register `rule(ctx, *args, **params)` as `prim`'s lowering for every platform (see
    `platform_rule`; `xla`: the rule of platforms without a jax_rccl runtime).

    cacheable=False, by choice: JAX would otherwise lower equal equations of a module once and
    call the result for each, so two calls of the program would share one custom call, one
    position in the program order and one identity; each call site keeps its own."""
    mlir.register_lowering(prim, platform_rule(prim, rule, supported, xla), cacheable=False)
