// See ffi/handlers/collective.h.
#include "ffi/handlers/collective.h"

namespace jax_rccl {

namespace ffi = xla::ffi;

std::string GroupsText(const CallAttrs& attrs) {
  std::string all;
  for (const auto& g : attrs.groups) {
    all += "[";
    for (size_t i = 0; i < g.size(); ++i) all += (i ? ", " : "") + std::to_string(g[i]);
    all += "]";
  }
  return all;
}

Status NotInGroups(const CallAttrs& attrs, int64_t device, const std::string& where) {
  JR_FAIL(Code::kInvalidArgument, "jax_rccl '", attrs.name, "': device ", device, where,
          " is in none of the replica groups ", GroupsText(attrs));
}

Status ReadSlotLeaves(const CallAttrs& attrs, SlotBase& slot, const ffi::RemainingArgs& args,
                      const ffi::RemainingRets& rets) {
  return attrs.kind == Kind::kRaggedAllToAll
             ? ReadRaggedLeaves(attrs, args, rets, &slot.ragged, &slot.leaves)
             : ReadLeaves(attrs, args, rets, &slot.leaves);
}

StatusOr<std::vector<TaskDesc>> SlotTasks(const CallAttrs& attrs, SlotBase& slot,
                                          bool oneRankCopies) {
  RankTasks rt = attrs.kind == Kind::kRaggedAllToAll
                     ? MakeRaggedTasks(attrs, slot.rank, slot.ragged)
                     : MakeRankTasks(attrs, slot.rank, slot.leaves, oneRankCopies);
  slot.sources = std::move(rt.sources);
  slot.zeroBefore = std::move(rt.zeroBefore);
  slot.zeroAfter = std::move(rt.zeroAfter);
  std::vector<TaskDesc> tasks = std::move(rt.tasks);
  if (attrs.premul == 0) return tasks;
  if (attrs.premul == 2) slot.scalarCells = std::make_unique<uint64_t[]>(slot.leaves.size());
  for (size_t t = 0; t < tasks.size(); ++t) {
    TaskDesc& task = tasks[t];
    // Only the reductions scale their inputs (a copy the plan makes stays a copy).
    if (task.coll != Coll::kAllReduce && task.coll != Coll::kReduceScatter &&
        task.coll != Coll::kReduce) {
      continue;
    }
    if (attrs.premul == 1) {
      const uint64_t bits = ScalarBits(attrs.premulValue, task.dtype);
      JR_ASSIGN_OR_RETURN(task.op, slot.userOps.CreatePreMulSum(&bits, task.dtype,
                                                                ScalarResidence::kHostImmediate));
    } else {
      const size_t leaf = size_t(slot.sources[t].leaf);
      JR_ASSIGN_OR_RETURN(task.op, slot.userOps.CreatePreMulSum(&slot.scalarCells[leaf], task.dtype,
                                                                ScalarResidence::kDevice));
    }
  }
  return tasks;
}

StatusOr<Plan> PlanSlot(const CallAttrs& attrs, SlotBase& slot, const TopologyView& topo,
                        std::vector<TaskDesc> tasks, const char* where) {
  PlanRequest req;
  req.topo = topo;
  req.rank = slot.rank;
  req.tasks = std::move(tasks);
  req.tuning = attrs.tuning;
  req.params = attrs.plannerParams;
  req.userOps = &slot.userOps;
  req.persistent = true;
  JR_ASSIGN_OR_RETURN(Plan plan, MakePlan(req));
  if (!plan.tasks.empty()) {
    const TaskPlan& first = plan.tasks.front();
    const bool p2p = first.coll == Coll::kSend || first.coll == Coll::kRecv;
    slot.planAlgo = p2p ? CallSiteStats::kP2p : static_cast<int32_t>(first.algo);
    slot.planProto = static_cast<int32_t>(first.proto);
  }
  if (attrs.params.debug == "INFO" || attrs.params.debug == "TRACE") {
    LogPlan(attrs, slot.rank, plan, topo.nNodes, where);
  }
  return plan;
}

CallLeaves::CallLeaves(size_t n) : n_(n), p_(inline_) {
  if (n > kInline) {
    heap_.resize(3 * n);
    p_ = heap_.data();
  }
}

Status CallLeaves::Bind(const CallAttrs& attrs, const SlotBase& slot,
                        const ffi::RemainingArgs& args, const ffi::RemainingRets& rets) {
  for (size_t i = 0; i < n_; ++i) {
    auto a = args.get<ffi::AnyBuffer>(i);
    auto b = rets.get<ffi::AnyBuffer>(i);
    JR_REQUIRE(a.has_value() && b.has_value() && a->size_bytes() == slot.leaves.inBytes[i] &&
                   (*b)->size_bytes() == slot.leaves.outBytes[i],
               Code::kInvalidArgument, "jax_rccl '", attrs.name, "': leaf ", i,
               " changed shape since the plan was built");
    p_[i] = a->untyped_data();
    p_[n_ + i] = (*b)->untyped_data();
    p_[2 * n_ + i] = nullptr;
    if (attrs.premul == 2) {
      auto sc = args.get<ffi::AnyBuffer>(n_ + i);
      JR_REQUIRE(sc.has_value() && sc->size_bytes() >= DataTypeSize(slot.leaves.types[i]),
                 Code::kInvalidArgument, "jax_rccl '", attrs.name, "': premul operand ", n_ + i,
                 " is not a scalar of leaf ", i, "'s element type");
      p_[2 * n_ + i] = sc->untyped_data();
    }
  }
  if (slot.deviceCheckAt >= 0) {
    auto check = args.get<ffi::AnyBuffer>(size_t(slot.deviceCheckAt));
    JR_REQUIRE(check.has_value(), Code::kInvalidArgument, "jax_rccl '", attrs.name, "': operand ",
               slot.deviceCheckAt, " (the device check) is not a buffer");
    deviceCheck = check->untyped_data();
  }
  return Status::Ok();
}

}  // namespace jax_rccl
