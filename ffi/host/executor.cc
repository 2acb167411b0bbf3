// The host executor: runs a Plan on the calling thread the way the device kernels will.
//
// Each kernel plan's channels are lanes that progress concurrently (a GPU runs them as
// independent blocks, and ranks may reach them in different orders), driven by one loop on the
// calling thread: every lane holds its current work as resumable state machines, one per work
// element, that advance piece by piece while their FIFO slots allow and return when blocked. When
// no lane can move, the thread sleeps on its doorbell with a short timeout (the deadline and the
// abort flag are checked on every wake-up).
//
// Element programs follow RCCL's device code step by step (after RCCL src/device/all_reduce.h,
// all_gather.h, reduce_scatter.h, broadcast.h, reduce.h, sendrecv.h and prims_simple.h): a
// collective element is a sequence of primitives (send, recvReduceSend, recvReduceCopySend,
// recvCopySend, recv, ...) over chunks, each primitive moving its elements through the FIFO in
// pieces of at most one step. Direct elements (ours) read and write peers' buffers in place
// between two barriers.
#include "ffi/host/executor.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "ffi/compute/coll_program.h"
#include "ffi/host/executor_kernels.h"
#include "ffi/host/transport_host.h"

namespace jax_rccl {
namespace host {

namespace {

// Per task, per execution.
struct TaskRt {
  const TaskPlan* tp = nullptr;
  DataType unitType = DataType::kInt8;  // the planning type (int8 for gathers/broadcasts)
  int64_t unitSize = 1;
  PieceFn piece = nullptr;
  DirectFn direct = nullptr;
  uint64_t opArg = 0;
  const char* send = nullptr;
  char* recv = nullptr;
  int64_t bytes = -1;  // p2p: the bytes this execution moves (-1: as planned)
  StepTag tag;         // what its FIFO steps carry (the receiver's is the same)
};

int64_t DivUpI(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

bool IsCopyColl(Coll c) {
  return c == Coll::kAllGather || c == Coll::kBroadcast;
}

class Executor;

// One work element in progress: a sequence of primitives generated on demand.
struct Unit {
  enum Kind { kColl, kP2pSend, kP2pRecv, kNone } kind = kNone;
  const WorkElemColl* e = nullptr;
  WorkElemP2p p{};  // a p2p element, its byte count cut to the task's bytes of this execution
  TaskRt* t = nullptr;
  int channel = 0;
  int64_t stepCap = 0;  // units one FIFO step holds for this element's protocol
  int64_t nOps = 0;
  int64_t op = 0;
  bool haveOp = false;
  Prim cur;
  int64_t nPieces = 0, pieceUnits = 0, piece = 0;
  // Where it last blocked (for timeout messages).
  int blockedPeer = -1;
  bool blockedOnRecv = false;
  bool done() const { return op >= nOps; }
};

struct Lane {
  int channel = 0;
  const ChannelPlan* ch = nullptr;
  int work = -1;
  std::vector<Unit> units;
  bool done = false;
};

class Executor {
 public:
  Executor(const Plan& plan, const ExecContext& ctx, HostFifoTransport* tr)
      : plan_(plan), ctx_(ctx), tr_(tr), rank_(ctx.rank), n_(ctx.nRanks) {}

  Status Run();

 private:
  Status PrepareTasks();
  Status RunOneRank();
  Status RunKernel(const KernelPlan& kp);
  Status StartWork(Lane* lane);
  Status AdvanceLane(Lane* lane, bool* progressed);
  Status AdvanceUnit(Unit* u, bool* progressed);
  Prim CollPrim(const Unit& u, int64_t i) const;
  int64_t CollOpCount(const Unit& u) const;
  // phase 0: the reduction or copy; phase 1 (all_reduce only, after a barrier): gather the
  // peers' reduced sub-slices into this rank's output.
  // `me`: the rank whose share runs (this rank, or any rank in a one-shot execution).
  Status RunDirect(const WorkElemColl& e, TaskRt* t, int phase, int me);
  Status TimeoutError(const std::vector<Lane>& lanes) const;
  Status MismatchError(const Unit& u, int peer, const StepTag& got) const;
  std::string RankName(int r) const {
    return ctx_.rankNames != nullptr && size_t(r) < ctx_.rankNames->size()
               ? (*ctx_.rankNames)[size_t(r)]
               : detail::StrCat("rank ", r);
  }

  const Plan& plan_;
  const ExecContext& ctx_;
  HostFifoTransport* tr_;
  int rank_, n_;
  std::vector<TaskRt> tasks_;
};

Status Executor::PrepareTasks() {
  const auto& mine = (*ctx_.peers)[rank_];
  JR_REQUIRE(mine.size() >= plan_.tasks.size(), Code::kInvalidArgument, ctx_.name, ": rank ", rank_,
             " has ", mine.size(), " buffer slots, the plan has ", plan_.tasks.size(), " tasks");
  tasks_.resize(plan_.tasks.size());
  for (size_t i = 0; i < plan_.tasks.size(); ++i) {
    const TaskPlan& tp = plan_.tasks[i];
    TaskRt& t = tasks_[i];
    t.tp = &tp;
    t.send = static_cast<const char*>(mine[i].send);
    t.recv = static_cast<char*>(mine[i].recv);
    t.bytes = mine[i].bytes;
    const bool p2p = tp.coll == Coll::kSend || tp.coll == Coll::kRecv;
    // A send and its receive carry the same tag (the kind of a point-to-point step is "send").
    t.tag.call = ctx_.callId;
    t.tag.seq = ctx_.seq;
    t.tag.count = tp.count;
    t.tag.coll = uint8_t(p2p ? Coll::kSend : tp.coll);
    t.tag.dtype = uint8_t(tp.dtype);
    t.tag.op = uint8_t(p2p ? DevRedOp::kSum : tp.opFull.op);
    t.unitType = (p2p || IsCopyColl(tp.coll)) ? DataType::kInt8 : tp.dtype;
    t.unitSize = int64_t(DataTypeSize(t.unitType));
    if (p2p || IsCopyColl(tp.coll)) {
      t.piece = CopyPieceFn();
      continue;
    }
    const KernelFns fns = GetKernelFns(tp.dtype, tp.opFull.op);
    JR_REQUIRE(fns.piece != nullptr, Code::kUnsupported, ctx_.name, ": task ", i, " (",
               CollName(tp.coll), ") has no reduction for dtype ", DataTypeName(tp.dtype),
               " and op ", DevRedOpName(tp.opFull.op));
    t.piece = fns.piece;
    t.direct = fns.direct;
    t.opArg = tp.opFull.scalarArg;
    if (tp.opFull.scalarArgIsPtr) {
      // The scalar lives in (host) memory, read at each execution.
      const void* ptr = reinterpret_cast<const void*>(uintptr_t(tp.opFull.scalarArg));
      JR_REQUIRE(ptr != nullptr, Code::kInvalidArgument, ctx_.name, ": task ", i,
                 ": the PreMulSum scalar pointer is null");
      uint64_t bits = 0;
      std::memcpy(&bits, ptr, DataTypeSize(tp.dtype));
      t.opArg = bits;
    }
  }
  return Status::Ok();
}

// ncclLaunchOneRank: each collective is a copy (scaled for PreMulSum).
Status Executor::RunOneRank() {
  for (TaskRt& t : tasks_) {
    const TaskPlan& tp = *t.tp;
    if (tp.coll == Coll::kSend || tp.coll == Coll::kRecv || tp.count == 0) continue;
    JR_REQUIRE(t.send != nullptr && t.recv != nullptr, Code::kInvalidArgument, ctx_.name, ": task ",
               tp.index, " (", CollName(tp.coll), ") needs send and recv buffers");
    const int64_t n = int64_t(tp.count);
    if (IsCopyColl(tp.coll) || tp.opFull.op == DevRedOp::kSum || tp.opFull.op == DevRedOp::kProd ||
        tp.opFull.op == DevRedOp::kMinMax) {
      if (t.send != t.recv) std::memcpy(t.recv, t.send, size_t(n) * DataTypeSize(tp.dtype));
      continue;
    }
    const void* srcs[1] = {t.send};
    void* dsts[1] = {t.recv};
    t.direct(srcs, 1, dsts, 1, n, &t.opArg);
  }
  return Status::Ok();
}

int64_t Executor::CollOpCount(const Unit& u) const {
  return jax_rccl::CollOpCount(u.t->tp->pattern, *u.e, n_);
}

// The i-th primitive of a collective element (ffi/compute/coll_program.h).
Prim Executor::CollPrim(const Unit& u, int64_t i) const {
  return jax_rccl::CollPrim(u.t->tp->coll, u.t->tp->pattern, *u.e, rank_, n_, i);
}

// A large Direct all_reduce runs in two phases with a barrier between (each rank reduces its
// sub-slice into its own output, then copies the peers' sub-slices from theirs): every rank then
// writes only its own output, so a fresh output buffer's pages fault in on their owner's thread
// instead of all ranks contending for the same pages. Smaller ones save that barrier and write
// their sub-slice into every output in one pass.
constexpr int64_t kDirectTwoPhaseBytes = 8 << 20;

bool DirectTwoPhase(const WorkElemColl& e, int64_t unitSize) {
  return int64_t(e.workCount) * unitSize >= kDirectTwoPhaseBytes;
}

// Direct (ours): reads (and for small all_reduces and reduce, writes) peers' buffers in place;
// the caller holds the barriers.
Status Executor::RunDirect(const WorkElemColl& e, TaskRt* t, int phase, int me) {
  const TaskPlan& tp = *t->tp;
  const auto& peers = *ctx_.peers;
  const int n = n_;
  const int64_t us = t->unitSize;
  const int64_t wo = int64_t(e.workOffset);
  const int64_t wc = int64_t(e.workCount);
  const int64_t count = int64_t(e.count);
  const size_t slot = e.slot;
  auto sendOf = [&](int k) { return static_cast<const char*>(peers[k][slot].send); };
  auto recvOf = [&](int k) { return static_cast<char*>(peers[k][slot].recv); };
  for (int k = 0; k < n; ++k) {
    JR_REQUIRE(peers[k].size() > slot, Code::kInvalidArgument, ctx_.name, ": rank ", k,
               " published no buffers for task ", slot);
  }
  // This rank's share of [0, wc): near-equal sub-slices aligned to 64 bytes.
  const int64_t align = std::max<int64_t>(1, 64 / us);
  const int64_t per = DivUpI(DivUpI(wc, n), align) * align;
  const int64_t myLo = std::min(wc, per * me);
  const int64_t myHi = std::min(wc, per * (me + 1));
  const int64_t myN = myHi - myLo;
  std::vector<const void*> srcs(n);
  std::vector<void*> dsts(n);
  std::vector<uint64_t> args(n);
  // A one-shot execution runs only plans whose op argument is the same on every rank.
  for (int k = 0; k < n; ++k) {
    args[k] = k == rank_ || ctx_.whole ? t->opArg : tr_->OpArg(k, slot);
  }
  char* const myRecv = recvOf(me);
  if (phase != 0 && tp.coll != Coll::kAllReduce) return Status::Ok();
  switch (tp.coll) {
    case Coll::kAllReduce: {
      if (!DirectTwoPhase(e, us)) {
        // One pass: sub-slice r over every input, written into every rank's output.
        if (phase != 0 || myN == 0) break;
        for (int k = 0; k < n; ++k) {
          srcs[k] = sendOf(k) + (wo + myLo) * us;
          dsts[k] = recvOf(k) + (wo + myLo) * us;
        }
        t->direct(srcs.data(), n, dsts.data(), n, myN, args.data());
      } else if (phase == 0) {
        // Reduce-scatter: sub-slice r over every input into this rank's own output.
        if (myN == 0) break;
        for (int k = 0; k < n; ++k) srcs[k] = sendOf(k) + (wo + myLo) * us;
        dsts[0] = myRecv + (wo + myLo) * us;
        t->direct(srcs.data(), n, dsts.data(), 1, myN, args.data());
      } else {
        // All-gather: the peers' reduced sub-slices from their outputs into this one.
        for (int k = 0; k < n; ++k) {
          if (k == me) continue;
          const int64_t lo = std::min(wc, per * k);
          const int64_t hi = std::min(wc, per * (k + 1));
          if (hi > lo) {
            std::memcpy(myRecv + (wo + lo) * us, recvOf(k) + (wo + lo) * us,
                        size_t((hi - lo) * us));
          }
        }
      }
      break;
    }
    case Coll::kReduce: {
      if (myN == 0) break;
      for (int k = 0; k < n; ++k) srcs[k] = sendOf(k) + (wo + myLo) * us;
      dsts[0] = recvOf(int(e.root)) + (wo + myLo) * us;
      t->direct(srcs.data(), n, dsts.data(), 1, myN, args.data());
      break;
    }
    case Coll::kReduceScatter: {
      for (int k = 0; k < n; ++k) srcs[k] = sendOf(k) + (int64_t(me) * count + wo) * us;
      dsts[0] = myRecv + wo * us;
      t->direct(srcs.data(), n, dsts.data(), 1, wc, args.data());
      break;
    }
    case Coll::kAllGather: {
      for (int k = 0; k < n; ++k) {
        char* to = myRecv + (int64_t(k) * count + wo) * us;
        const char* from = sendOf(k) + wo * us;
        if (to != from) std::memcpy(to, from, size_t(wc * us));
      }
      break;
    }
    case Coll::kBroadcast: {
      char* to = myRecv + wo * us;
      const char* from = sendOf(int(e.root)) + wo * us;
      if (to != from) std::memcpy(to, from, size_t(wc * us));
      break;
    }
    default:
      JR_FAIL(Code::kInternal, ctx_.name, ": task ", slot, ": direct has no program for ",
              CollName(tp.coll));
  }
  return Status::Ok();
}

Status Executor::StartWork(Lane* lane) {
  lane->units.clear();
  const Work& w = lane->ch->works[size_t(lane->work)];
  if (w.header.type == kWorkTypeColl) {
    for (int k = 0; k < kMaxWorkElements; ++k) {
      const WorkElemColl& e = w.elems[k];
      if (!e.isUsed) continue;
      JR_REQUIRE(e.slot < tasks_.size(), Code::kInternal, ctx_.name, ": work element names slot ",
                 e.slot, ", the plan has ", tasks_.size(), " tasks");
      TaskRt* t = &tasks_[e.slot];
      const TaskPlan& tp = *t->tp;
      if (tp.algo == Algo::kDirect || tp.pattern == Pattern::kDirect) continue;  // RunKernel
      Unit u;
      u.kind = Unit::kColl;
      u.e = &e;
      u.t = t;
      u.channel = lane->channel;
      const int proto = int(tp.proto);
      JR_REQUIRE(proto >= 0 && proto < kNumProtos, Code::kInternal, ctx_.name, ": task ", e.slot,
                 " has no protocol");
      u.stepCap = tr_->stepBytes(proto) / t->unitSize;
      JR_REQUIRE(u.stepCap > 0, Code::kInvalidArgument, ctx_.name, ": topology.buffSizes[",
                 ProtoName(tp.proto), "] gives FIFO steps smaller than one element");
      u.nOps = CollOpCount(u);
      JR_REQUIRE(u.nOps > 0 || e.workCount == 0, Code::kUnsupported, ctx_.name, ": task ", e.slot,
                 " (", CollName(tp.coll), "): the host executor has no program for pattern ",
                 PatternName(tp.pattern));
      lane->units.push_back(u);
    }
    return Status::Ok();
  }
  if (w.header.type != kWorkTypeP2p) return Status::Ok();
  for (int k = 0; k < kMaxWorkElementsP2p; ++k) {
    const WorkElemP2p& p = w.p2pElems[k];
    if (p.p2pType != kWorkP2pTypeSend && p.p2pType != kWorkP2pTypeRecv) continue;
    JR_REQUIRE(p.slot < tasks_.size(), Code::kInternal, ctx_.name, ": p2p element names slot ",
               p.slot, ", the plan has ", tasks_.size(), " tasks");
    Unit u;
    u.kind = p.p2pType == kWorkP2pTypeSend ? Unit::kP2pSend : Unit::kP2pRecv;
    u.p = p;
    u.t = &tasks_[p.slot];
    if (u.t->bytes >= 0) {
      // The element covers bytes [base, base + count) of its task as planned; this execution
      // moves `bytes` of it, spread over the elements (the channels) in the same proportion, so
      // every channel keeps its share. Both ends scale the same planned elements the same way.
      const int64_t base = int64_t((uint64_t(p.offsetHi) << 32) | p.offsetLo);
      const int64_t count = int64_t((uint64_t(p.countHi) << 32) | p.countLo);
      const int64_t planned = int64_t(u.t->tp->count * DataTypeSize(u.t->tp->dtype));
      const int64_t lo = ScaledEdge(base, planned, u.t->bytes);
      const int64_t hi = ScaledEdge(base + count, planned, u.t->bytes);
      const int64_t cut = std::max<int64_t>(0, hi - lo);
      u.p.offsetLo = uint32_t(uint64_t(lo) & 0xffffffffu);
      u.p.offsetHi = uint32_t(uint64_t(lo) >> 32) & 0xffffu;
      u.p.countHi = uint32_t(uint64_t(cut) >> 32);
      u.p.countLo = uint32_t(uint64_t(cut) & 0xffffffffu);
    }
    u.channel = lane->channel;
    // A 2-bit signed field in the work layout: Simple (2) reads back as -2.
    const int proto = int(p.proto) & 3;
    JR_REQUIRE(proto >= 0 && proto < kNumProtos && p.chunkSize > 0, Code::kInternal, ctx_.name,
               ": p2p element of task ", p.slot, " has protocol ", proto, " and chunk size ",
               p.chunkSize);
    u.stepCap = tr_->stepBytes(proto);
    JR_REQUIRE(u.stepCap > 0, Code::kInvalidArgument, ctx_.name, ": topology.buffSizes[",
               ProtoName(Proto(proto)), "] is too small for a FIFO step");
    // A transfer whose byte count comes from the operands and is 0 here is 0 at its peer too
    // (both read the same entry): neither side steps through the FIFO for it.
    const bool empty = u.t->bytes >= 0 && ((uint64_t(u.p.countHi) << 32) | u.p.countLo) == 0;
    u.nOps = empty ? 0 : P2pOpCount(u.p);
    lane->units.push_back(u);
  }
  // A send to self and the recv from self in one work: a direct copy (as RCCL's runSend does).
  Unit* selfSend = nullptr;
  Unit* selfRecv = nullptr;
  for (Unit& u : lane->units) {
    if (u.p.peer != rank_) continue;
    (u.kind == Unit::kP2pSend ? selfSend : selfRecv) = &u;
  }
  if (selfSend != nullptr && selfRecv != nullptr) {
    const WorkElemP2p& s = selfSend->p;
    const WorkElemP2p& r = selfRecv->p;
    const int64_t sBytes = int64_t((uint64_t(s.countHi) << 32) | s.countLo);
    const int64_t rBytes = int64_t((uint64_t(r.countHi) << 32) | r.countLo);
    JR_REQUIRE(sBytes == rBytes, Code::kInvalidUsage, ctx_.name, ": rank ", rank_, " sends ",
               sBytes, " bytes to itself but receives ", rBytes);
    const int64_t sOff = int64_t((uint64_t(s.offsetHi) << 32) | s.offsetLo);
    const int64_t rOff = int64_t((uint64_t(r.offsetHi) << 32) | r.offsetLo);
    if (sBytes > 0) {
      JR_REQUIRE(selfSend->t->send != nullptr && selfRecv->t->recv != nullptr,
                 Code::kInvalidArgument, ctx_.name, ": self send/recv needs both buffers");
      const char* from = selfSend->t->send + sOff;
      char* to = selfRecv->t->recv + rOff;
      if (from != to) std::memmove(to, from, size_t(sBytes));
    }
    selfSend->nOps = 0;
    selfRecv->nOps = 0;
  }
  return Status::Ok();
}

Status Executor::AdvanceUnit(Unit* u, bool* progressed) {
  TaskRt* t = u->t;
  const int64_t us = t->unitSize;
  while (!u->done()) {
    if (!u->haveOp) {
      Prim p;
      if (u->kind == Unit::kColl) {
        p = CollPrim(*u, u->op);
      } else {
        p = P2pPrim(u->p, u->op);
      }
      if ((p.flags & kSrcIn) && t->send == nullptr) {
        JR_FAIL(Code::kInvalidArgument, ctx_.name, ": rank ", rank_, " task ", t->tp->index, " (",
                CollName(t->tp->coll), ") needs a send buffer");
      }
      if ((p.flags & (kDst | kSrcOut)) && t->recv == nullptr) {
        JR_FAIL(Code::kInvalidArgument, ctx_.name, ": rank ", rank_, " task ", t->tp->index, " (",
                CollName(t->tp->coll), ") needs a recv buffer");
      }
      u->cur = p;
      u->nPieces = PieceCount(p.n, u->stepCap);
      u->pieceUnits = PieceUnits(p.n, u->nPieces);
      u->piece = 0;
      u->haveOp = true;
    }
    const Prim& p = u->cur;
    HostConn* in = nullptr;
    HostConn* out = nullptr;
    char* inSlots = nullptr;
    char* outSlots = nullptr;
    if (p.flags & kRecv) {
      in = tr_->Conn(u->channel, p.recvPeer, rank_);
      inSlots = tr_->Slots(u->channel, p.recvPeer, rank_);
      JR_REQUIRE(in != nullptr && inSlots != nullptr, Code::kInternal, ctx_.name,
                 ": no connection on channel ", u->channel, " from rank ", p.recvPeer, " to rank ",
                 rank_);
    }
    if (p.flags & kSend) {
      out = tr_->Conn(u->channel, rank_, p.sendPeer);
      outSlots = tr_->Slots(u->channel, rank_, p.sendPeer);
      JR_REQUIRE(out != nullptr && outSlots != nullptr, Code::kInternal, ctx_.name,
                 ": no connection on channel ", u->channel, " from rank ", rank_, " to rank ",
                 p.sendPeer);
    }
    while (u->piece < u->nPieces) {
      uint64_t rs = 0, ss = 0;
      if (in != nullptr) {
        rs = in->head.load(std::memory_order_relaxed);
        if (in->tail.load(std::memory_order_acquire) <= rs) {
          u->blockedPeer = p.recvPeer;
          u->blockedOnRecv = true;
          return Status::Ok();
        }
        // Before a byte of the step is read, and even while the send side has no room: it must
        // belong to this rank's call and task.
        if (ctx_.checkSteps && !(in->tags[rs % kSteps] == t->tag)) {
          return MismatchError(*u, p.recvPeer, in->tags[rs % kSteps]);
        }
      }
      if (out != nullptr) {
        ss = out->tail.load(std::memory_order_relaxed);
        if (ss - out->head.load(std::memory_order_acquire) >= uint64_t(kSteps)) {
          u->blockedPeer = p.sendPeer;
          u->blockedOnRecv = false;
          return Status::Ok();
        }
      }
      const int64_t lo = u->piece * u->pieceUnits;
      const int64_t m = std::max<int64_t>(0, std::min(u->pieceUnits, p.n - lo));
      const int64_t bytes = m * us;
      PieceArgs a;
      a.n = m;
      if (in != nullptr) {
        const int64_t got = in->slotSizes[rs % kSteps];
        JR_REQUIRE(got == bytes, Code::kInternal, ctx_.name, ": rank ", rank_, " channel ",
                   u->channel, ": expected a FIFO step of ", bytes, " bytes from rank ", p.recvPeer,
                   ", got ", got, " (the ranks' plans disagree)");
        a.in = tr_->Slot(inSlots, rs);
      }
      if (p.flags & kSrcIn) a.src = t->send + (p.srcOff + lo) * us;
      if (p.flags & kSrcOut) a.src = t->recv + (p.srcOff + lo) * us;
      a.preSrc = (p.flags & kSrcIn) != 0;
      if (p.flags & kDst) a.dst = t->recv + (p.dstOff + lo) * us;
      if (out != nullptr) a.out = tr_->Slot(outSlots, ss);
      a.post = (p.flags & kPostOp) != 0;
      t->piece(a, t->opArg);
      if (out != nullptr) {
        out->slotSizes[ss % kSteps] = bytes;
        out->tags[ss % kSteps] = t->tag;
        out->tail.store(ss + 1, std::memory_order_release);
        tr_->Ring(p.sendPeer);
      }
      if (in != nullptr) {
        in->head.store(rs + 1, std::memory_order_release);
        tr_->Ring(p.recvPeer);
      }
      u->piece += 1;
      *progressed = true;
    }
    u->op += 1;
    u->haveOp = false;
  }
  return Status::Ok();
}

Status Executor::AdvanceLane(Lane* lane, bool* progressed) {
  while (!lane->done) {
    bool allDone = true;
    for (Unit& u : lane->units) {
      JR_CHECK(AdvanceUnit(&u, progressed));
      allDone = allDone && u.done();
    }
    if (!allDone) return Status::Ok();
    lane->work += 1;
    if (lane->work >= lane->ch->nWork()) {
      lane->done = true;
      lane->units.clear();
      return Status::Ok();
    }
    JR_CHECK(StartWork(lane));
    *progressed = true;
  }
  return Status::Ok();
}

}  // namespace

std::string StepTagString(const StepTag& t) {
  const Coll c = Coll(t.coll);
  const bool p2p = c == Coll::kSend || c == Coll::kRecv;
  char id[17];
  std::snprintf(id, sizeof(id), "%016llx", static_cast<unsigned long long>(t.call));
  return detail::StrCat("call #", t.seq, " (", p2p ? "send/recv" : CollName(c), " ",
                        DataTypeName(DataType(t.dtype)), " x", t.count,
                        p2p || c == Coll::kAllGather || c == Coll::kBroadcast
                            ? std::string()
                            : detail::StrCat(" ", DevRedOpName(DevRedOp(t.op))),
                        "; id ", id, ")");
}

namespace {

Status Executor::MismatchError(const Unit& u, int peer, const StepTag& got) const {
  const StepTag& mine = u.t->tag;
  std::string what;
  if (got.call == 0 && got.seq == 0 && got.count == 0) {
    what = "a step without a call tag (a peer running an older jax_rccl?)";
  } else {
    what = detail::StrCat("a step of its ", StepTagString(got));
  }
  JR_FAIL(Code::kInvalidUsage, ctx_.name, ": mismatched calls: ", RankName(peer), " sent ", what,
          " on channel ", u.channel, " where ", RankName(rank_), " runs its ", StepTagString(mine),
          got.seq != mine.seq ? " (the ranks are not at the same call of the group: one made more "
                                "calls than the other)"
                              : " (the processes ran different collectives at this point, or the "
                                "same ones in a different order)",
          "; no data of the step was used");
}

Status Executor::TimeoutError(const std::vector<Lane>& lanes) const {
  for (const Lane& lane : lanes) {
    if (lane.done) continue;
    for (const Unit& u : lane.units) {
      if (u.done() || u.blockedPeer < 0) continue;
      if (u.blockedOnRecv) {
        JR_FAIL(Code::kTimeout, ctx_.name, ": rank ", rank_, " timed out on channel ", lane.channel,
                " waiting for data from rank ", u.blockedPeer,
                " (JAX_RCCL_TIMEOUT; did every rank of the group make this call?)");
      }
      JR_FAIL(Code::kTimeout, ctx_.name, ": rank ", rank_, " timed out on channel ", lane.channel,
              " waiting for rank ", u.blockedPeer,
              " to drain its FIFO (JAX_RCCL_TIMEOUT; did every rank of the group make this call?)");
    }
  }
  JR_FAIL(Code::kTimeout, ctx_.name, ": rank ", rank_, " timed out (JAX_RCCL_TIMEOUT)");
}

Status Executor::RunKernel(const KernelPlan& kp) {
  bool hasDirect = false;
  bool hasDirectAllReduce = false;
  std::vector<std::pair<const WorkElemColl*, TaskRt*>> direct;
  std::vector<Lane> lanes;
  for (int c = 0; c < kp.channelUbound && c < int(kp.channels.size()); ++c) {
    const ChannelPlan& ch = kp.channels[size_t(c)];
    if (ch.works.empty()) continue;
    for (const Work& w : ch.works) {
      if (w.header.type != kWorkTypeColl) continue;
      for (int k = 0; k < kMaxWorkElements; ++k) {
        const WorkElemColl& e = w.elems[k];
        if (!e.isUsed || e.slot >= tasks_.size()) continue;
        const TaskPlan& tp = *tasks_[e.slot].tp;
        if (tp.algo == Algo::kDirect || tp.pattern == Pattern::kDirect) {
          hasDirect = true;
          hasDirectAllReduce = hasDirectAllReduce || (tp.coll == Coll::kAllReduce &&
                                                      DirectTwoPhase(e, tasks_[e.slot].unitSize));
          direct.emplace_back(&e, &tasks_[e.slot]);
        }
      }
    }
    Lane lane;
    lane.channel = c;
    lane.ch = &ch;
    lanes.push_back(std::move(lane));
  }
  if (ctx_.whole) {
    // One thread runs every rank's share, phase by phase: the order of the phases stands in for
    // the barriers (the Communicator runs one-shot only plans of Direct elements).
    // Only Direct elements (OneShotEligible): anything else here would be skipped, so it fails.
    for (const Lane& lane : lanes) {
      for (const Work& w : lane.ch->works) {
        JR_REQUIRE(w.header.type != kWorkTypeP2p, Code::kInternal, ctx_.name,
                   ": a one-shot execution met a point-to-point work");
        if (w.header.type != kWorkTypeColl) continue;
        for (int k = 0; k < kMaxWorkElements; ++k) {
          const WorkElemColl& e = w.elems[k];
          if (!e.isUsed || e.slot >= tasks_.size()) continue;
          const TaskPlan& tp = *tasks_[e.slot].tp;
          JR_REQUIRE(tp.algo == Algo::kDirect || tp.pattern == Pattern::kDirect, Code::kInternal,
                     ctx_.name, ": a one-shot execution met a FIFO element (task ", e.slot, ")");
        }
      }
    }
    for (int phase = 0; phase < (hasDirectAllReduce ? 2 : 1); ++phase) {
      for (int me = 0; me < n_; ++me) {
        for (auto& [e, t] : direct) JR_CHECK(RunDirect(*e, t, phase, me));
      }
    }
    return Status::Ok();
  }
  if (hasDirect) {
    JR_REQUIRE(static_cast<bool>(ctx_.barrier), Code::kInternal, ctx_.name,
               ": a direct algorithm needs the execution's barrier");
    std::vector<uint64_t> args(tasks_.size());
    for (size_t i = 0; i < tasks_.size(); ++i) args[i] = tasks_[i].opArg;
    tr_->PublishOpArgs(rank_, args);
    JR_CHECK(ctx_.barrier());
    for (auto& [e, t] : direct) JR_CHECK(RunDirect(*e, t, 0, rank_));
    if (hasDirectAllReduce) {
      JR_CHECK(ctx_.barrier());
      for (auto& [e, t] : direct) JR_CHECK(RunDirect(*e, t, 1, rank_));
    }
  }
  for (Lane& lane : lanes) {
    lane.work = 0;
    JR_CHECK(StartWork(&lane));
  }
  while (true) {
    const uint32_t seen = tr_->Seq(rank_);
    bool progressed = false;
    bool allDone = true;
    for (Lane& lane : lanes) {
      JR_CHECK(AdvanceLane(&lane, &progressed));
      allDone = allDone && lane.done;
    }
    if (allDone) break;
    if (ctx_.aborted != nullptr && ctx_.aborted->load(std::memory_order_acquire)) {
      JR_FAIL(Code::kTimeout, ctx_.name, ": rank ", rank_,
              " stopped: the communicator failed (another rank timed out or failed)");
    }
    if (progressed) continue;
    std::string why;
    if (ctx_.peerFailed && ctx_.peerFailed(&why)) {
      JR_FAIL(Code::kTimeout, ctx_.name, ": rank ", rank_, " stopped: ", why);
    }
    const auto now = Clock::now();
    if (now >= ctx_.deadline) return TimeoutError(lanes);
    const int64_t left =
        std::chrono::duration_cast<std::chrono::nanoseconds>(ctx_.deadline - now).count();
    tr_->Wait(rank_, seen, std::min<int64_t>(left, 5000000));
  }
  if (hasDirect) JR_CHECK(ctx_.barrier());
  return Status::Ok();
}

Status Executor::Run() {
  JR_CHECK(PrepareTasks());
  if (plan_.oneRank) JR_CHECK(RunOneRank());
  for (const KernelPlan& kp : plan_.kernels) JR_CHECK(RunKernel(kp));
  return Status::Ok();
}

}  // namespace

bool OneShotEligible(const Plan& plan, int64_t maxBytes) {
  if (maxBytes <= 0 || plan.nRanks < 2 || plan.oneRank || plan.tasks.empty()) return false;
  int64_t bytes = 0;
  for (const TaskPlan& tp : plan.tasks) {
    if (tp.coll == Coll::kSend || tp.coll == Coll::kRecv) return false;
    if (tp.algo != Algo::kDirect && tp.pattern != Pattern::kDirect) return false;
    if (tp.opFull.scalarArgIsPtr) return false;  // a scalar each rank reads at its own turn
    // The larger of a rank's buffers (all_gather's output, psum_scatter's input); reductions
    // whose every rank's output takes the whole result count four times (one thread reads every
    // input and writes every output, where all_gather's and psum_scatter's move one of the two).
    const bool spread = tp.coll == Coll::kAllGather || tp.coll == Coll::kReduceScatter;
    const int64_t weight = spread ? plan.nRanks : (tp.coll == Coll::kAllReduce ? 4 : 1);
    bytes += int64_t(tp.count) * int64_t(DataTypeSize(tp.dtype)) * weight;
  }
  return bytes <= maxBytes;
}

Status ExecutePlan(const Plan& plan, const ExecContext& ctx) {
  JR_REQUIRE(ctx.peers != nullptr, Code::kInternal, ctx.name, ": no peer buffer table");
  JR_REQUIRE(ctx.rank >= 0 && ctx.rank < ctx.nRanks && size_t(ctx.nRanks) == ctx.peers->size(),
             Code::kInternal, ctx.name, ": rank ", ctx.rank, " of ", ctx.nRanks,
             " does not match the buffer table of ", ctx.peers->size(), " ranks");
  JR_REQUIRE(plan.rank == ctx.rank && plan.nRanks == ctx.nRanks, Code::kInternal, ctx.name,
             ": the plan was built for rank ", plan.rank, " of ", plan.nRanks,
             ", executed as rank ", ctx.rank, " of ", ctx.nRanks);
  HostFifoTransport* tr = nullptr;
  if (!plan.kernels.empty()) {
    tr = dynamic_cast<HostFifoTransport*>(ctx.transport);
    JR_REQUIRE(tr != nullptr && tr->nRanks() == ctx.nRanks, Code::kInternal, ctx.name,
               ": the host executor needs a host transport of ", ctx.nRanks, " ranks");
  }
  Executor ex(plan, ctx, tr);
  return ex.Run();
}

}  // namespace host
}  // namespace jax_rccl
