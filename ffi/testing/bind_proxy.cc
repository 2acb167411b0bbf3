// The network proxy (ffi/comm/proxy.h) driven by a host-memory stand-in for the GPU kernel: each
// local rank is a thread that fills its send FIFOs and drains its receive FIFOs exactly as a
// kernel does (slot, info word, tail; head to free a slot), step by step, with data it can check.
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "ffi/bind/bindings.h"
#include "ffi/comm/group.h"
#include "ffi/comm/net_stream.h"
#include "ffi/comm/notice.h"
#include "ffi/comm/proxy.h"
#include "ffi/core/params.h"
#include "ffi/core/stats.h"
#include "ffi/planner/work.h"

namespace nb = nanobind;

namespace jax_rccl {
namespace {

using comm::kProxyProtocols;

template <typename... Args>
void Check(bool ok, Args&&... args) {
  if (!ok) throw nb::value_error(detail::StrCat(std::forward<Args>(args)...).c_str());
}

// One direction of one connection, in host memory, as a kernel's FIFO would be.
struct StandInFifo {
  alignas(64) uint64_t tail = 0;
  alignas(64) uint64_t head = 0;
  uint64_t info[kSteps] = {};
  std::vector<char> data;  // kSteps slots of the largest step, for steps of any protocol
};

// A connection's steps, in order: the protocol of each.
struct StandInConn {
  int channel = 0, local = 0, remote = 0;
  bool send = false;
  std::vector<int> protocols;
  StandInFifo fifo;
  uint64_t next = 0;  // the stand-in's next step
};

uint64_t Word(int channel, int from, int to, uint64_t step, int64_t i) {
  uint64_t x = (uint64_t(channel) << 48) ^ (uint64_t(from) << 40) ^ (uint64_t(to) << 32) ^
               (step << 20) ^ uint64_t(i);
  x ^= x >> 31;
  x *= 0x9e3779b97f4a7c15ull;
  return x ^ (x >> 29);
}
// The bytes of a step: varies with the step, at least one word, a multiple of 8.
int64_t StepBytes(int64_t stepBytes, int channel, int from, uint64_t step) {
  const int64_t words = stepBytes / 8;
  const int64_t cut = int64_t((step + uint64_t(channel) + uint64_t(from)) % 4) * words / 8;
  return std::max<int64_t>(1, words - cut) * 8;
}

// Runs the ranks' programs (see BindProxy).
nb::dict RunNetProxy(const std::string& session, int process, uint64_t group,
                     const std::vector<std::string>& endpoints,
                     const std::vector<int>& host_of_rank, const std::vector<int>& local_ranks,
                     const nb::list& program, const std::vector<int64_t>& step_bytes,
                     double timeout_s, int64_t stop_after, bool verify, int net_threads,
                     bool drain_wait, int64_t recv_delay_us, int net_streams, int hold_channel,
                     const std::string& trace_dir, int64_t trace_events, const std::string& net,
                     bool abort_at_stop) {
  Check(step_bytes.size() == size_t(kProxyProtocols), "step_bytes: 3 sizes");
  Check(nb::len(program) == local_ranks.size(), "program: one list per local rank");
  const std::vector<std::pair<const char*, int64_t>> statsBefore = StatsSnapshot();
  const int nRanks = int(endpoints.size());
  const int64_t slotBytes = *std::max_element(step_bytes.begin(), step_bytes.end());
  auto rankString = [&](int r) {
    return detail::StrCat("rank ", r, " (host ", host_of_rank[size_t(r)], ")");
  };
  // The connections, keyed by (channel, local, remote, send).
  std::map<std::tuple<int, int, int, bool>, std::unique_ptr<StandInConn>> conns;
  auto connOf = [&](int channel, int local, int remote, bool send) -> StandInConn& {
    Check(remote >= 0 && remote < nRanks, "peer out of range");
    Check(host_of_rank[size_t(remote)] != host_of_rank[size_t(local)], "a proxy op names rank ",
          remote, " of the same host as rank ", local);
    auto& slot = conns[std::make_tuple(channel, local, remote, send)];
    if (!slot) {
      slot = std::make_unique<StandInConn>();
      slot->channel = channel;
      slot->local = local;
      slot->remote = remote;
      slot->send = send;
      slot->fifo.data.assign(size_t(slotBytes * kSteps), 0);
    }
    return *slot;
  };
  for (size_t i = 0; i < local_ranks.size(); ++i) {
    for (nb::handle h : nb::cast<nb::list>(program[i])) {
      nb::dict op = nb::cast<nb::dict>(h);
      const int channel = nb::cast<int>(op["channel"]);
      const std::string proto = nb::cast<std::string>(op["protocol"]);
      const int p = proto == "ll" ? 0 : proto == "ll128" ? 1 : 2;
      const int nsteps = nb::cast<int>(op["nsteps"]);
      for (nb::handle peer : nb::cast<nb::list>(op["send_peers"])) {
        auto& c = connOf(channel, local_ranks[i], nb::cast<int>(peer), true);
        c.protocols.insert(c.protocols.end(), size_t(nsteps), p);
      }
      for (nb::handle peer : nb::cast<nb::list>(op["recv_peers"])) {
        auto& c = connOf(channel, local_ranks[i], nb::cast<int>(peer), false);
        c.protocols.insert(c.protocols.end(), size_t(nsteps), p);
      }
    }
  }
  std::vector<comm::ProxyConnection> pcs;
  std::vector<StandInConn*> order;
  for (auto& [key, c] : conns) {
    comm::ProxyConnection pc;
    pc.channel = c->channel;
    pc.local = c->local;
    pc.remote = c->remote;
    pc.send = c->send;
    pc.fifo.tail = &c->fifo.tail;
    pc.fifo.head = &c->fifo.head;
    pc.fifo.info = c->fifo.info;
    pc.fifo.slots = c->fifo.data.data();
    pc.fifo.slotBytes = slotBytes;
    pcs.push_back(pc);
    order.push_back(c.get());
  }
  // The network JAX_RCCL_NET names (or `net`), as a GPU group's (ffi/gpu/comm.cc: SetShared).
  StatusOr<Params> params = LoadValidParams();
  ThrowIfError(params.status());
  comm::NetOptions options;
  options.backend = net.empty() ? params.value().net : net;
  options.session = session;
  options.process = process;
  options.threads = net_threads;
  options.streams = net_streams;
  options.info = params.value().debug == "INFO" || params.value().debug == "TRACE";
  StatusOr<std::unique_ptr<comm::Net>> made = comm::MakeNet(options);
  ThrowIfError(made.status());
  auto proxy =
      std::make_unique<comm::NetProxy>(made.take(), group, pcs, endpoints, rankString, timeout_s);
  if (trace_events > 0) {
    proxy->TraceTo(trace_dir, size_t(trace_events));
  } else {
    proxy->TraceTo(trace_dir);
  }
  const Clock::time_point deadline =
      Clock::now() + std::chrono::microseconds(int64_t(timeout_s * 1e6));
  Status connected;
  {
    nb::gil_scoped_release release;
    connected = proxy->Connect(deadline);
  }
  ThrowIfError(connected);  // with the interpreter's lock (it raises a Python exception)
  // The stand-in kernels: one thread per local rank, over all its connections.
  std::vector<Status> errors(local_ranks.size());
  std::atomic<bool> abandoned{false};
  const Clock::time_point started = Clock::now();
  {
    nb::gil_scoped_release release;
    std::vector<std::thread> threads;
    for (size_t i = 0; i < local_ranks.size(); ++i) {
      threads.emplace_back([&, i]() {
        const int rank = local_ranks[i];
        std::vector<StandInConn*> mine;
        for (StandInConn* c : order) {
          if (c->local == rank) mine.push_back(c);
        }
        int64_t moved = 0;
        Clock::time_point lastProgress = Clock::now();
        while (true) {
          bool all = true, progressed = false;
          // `hold_channel`: its receives wait until every other connection is done.
          bool othersDone = true;
          for (StandInConn* c : mine) {
            if (c->channel != hold_channel && c->next < c->protocols.size()) othersDone = false;
          }
          for (StandInConn* c : mine) {
            StandInFifo& f = c->fifo;
            if (!c->send && c->channel == hold_channel && !othersDone) {
              all = false;
              continue;
            }
            while (c->next < c->protocols.size()) {
              if (stop_after >= 0 && moved >= stop_after) {
                abandoned.store(true);
                return;
              }
              const uint64_t s = c->next;
              const int p = c->protocols[s];
              const int64_t sb = step_bytes[size_t(p)];
              char* slotPtr = f.data.data() + int64_t(s % kSteps) * slotBytes;
              const int from = c->send ? c->local : c->remote, to = c->send ? c->remote : c->local;
              const int64_t n = StepBytes(sb, c->channel, from, s);
              // Data checks off: only the step's first and last words.
              const int64_t stride = verify ? 1 : std::max<int64_t>(1, n / 8 - 1);
              uint64_t* words = reinterpret_cast<uint64_t*>(slotPtr);
              if (c->send) {
                if (s - __atomic_load_n(&f.head, __ATOMIC_ACQUIRE) >= uint64_t(kSteps)) break;
                for (int64_t w = 0; w < n / 8; w += stride) {
                  words[w] = Word(c->channel, from, to, s, w);
                }
                __atomic_store_n(&f.info[s % kSteps], comm::ProxyStepInfo(p, uint64_t(n)),
                                 __ATOMIC_RELEASE);
                __atomic_store_n(&f.tail, s + 1, __ATOMIC_RELEASE);
              } else {
                if (__atomic_load_n(&f.tail, __ATOMIC_ACQUIRE) <= s) break;
                for (int64_t w = 0; w < n / 8; w += stride) {
                  if (words[w] != Word(c->channel, from, to, s, w)) {
                    errors[i] =
                        Status(Code::kInternal,
                               detail::StrCat("rank ", rank, " received wrong data in step ", s,
                                              " of channel ", c->channel, " from rank ", from,
                                              " (word ", w, ")"));
                    return;
                  }
                }
                if (recv_delay_us > 0) {
                  std::this_thread::sleep_for(std::chrono::microseconds(recv_delay_us));
                }
                __atomic_store_n(&f.head, s + 1, __ATOMIC_RELEASE);
              }
              ++c->next;
              ++moved;
              progressed = true;
            }
            if (c->next < c->protocols.size()) all = false;
          }
          if (all) return;
          std::string reason;
          if (proxy->Failed(&reason)) {
            errors[i] = Status(Code::kSystem, reason);
            return;
          }
          if (progressed) {
            lastProgress = Clock::now();
          } else if (Clock::now() - lastProgress >
                     std::chrono::microseconds(int64_t(2 * timeout_s * 1e6))) {
            for (StandInConn* c : mine) {
              if (c->next < c->protocols.size()) {
                errors[i] = Status(
                    Code::kTimeout,
                    detail::StrCat("rank ", rank, " timed out on channel ", c->channel,
                                   c->send ? " sending step " : " waiting for step ", c->next,
                                   c->send ? " to " : " from ", rankString(c->remote)));
                return;
              }
            }
          } else {
            std::this_thread::sleep_for(std::chrono::microseconds(20));
          }
        }
      });
    }
    for (std::thread& t : threads) t.join();
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  if (abandoned.load()) {
    // A fault test: this process stops here with its connections open (it exits or sleeps), or
    // with its proxy aborted from outside once its thread idles (`abort_at_stop`).
    if (abort_at_stop) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      proxy->Abort("the stand-in aborted its proxy");
    }
    (void)proxy.release();
    (void)new decltype(conns)(std::move(conns));  // the FIFOs it serves stay too
    return nb::dict();
  }
  for (const Status& s : errors) ThrowIfError(s);
  // Every step out is on the wire before the connections close.
  {
    nb::gil_scoped_release release;
    const Clock::time_point drainBy =
        Clock::now() + std::chrono::microseconds(int64_t(timeout_s * 1e6));
    while (drain_wait && Clock::now() < drainBy) {
      bool drained = true;
      const std::vector<uint64_t> m = proxy->StepsMoved();
      for (size_t k = 0; k < order.size(); ++k) {
        if (m[k] < order[k]->protocols.size()) drained = false;
      }
      std::string reason;
      if (drained || proxy->Failed(&reason)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  std::string reason;
  if (proxy->Failed(&reason)) ThrowIfError(Status(Code::kSystem, reason));
  const std::vector<std::string> transports = proxy->Transports();
  proxy->Stop();  // without drain_wait: Stop itself ships what is still in the slots
  const std::vector<uint64_t> final = proxy->StepsMoved();
  nb::list connList;
  for (size_t k = 0; k < order.size(); ++k) {
    const StandInConn& c = *order[k];
    connList.append(nb::make_tuple(c.channel, c.send ? c.local : c.remote,
                                   c.send ? c.remote : c.local, c.next, final[k]));
  }
  nb::dict out;
  out["conns"] = connList;
  out["seconds"] = seconds;
  out["bytes"] = proxy->bytesMoved();
  nb::list transportList;
  for (const std::string& t : transports) transportList.append(t);
  out["transports"] = transportList;
  // The runtime counters the proxy added during this call (its net_* ones).
  nb::dict stats;
  const std::vector<std::pair<const char*, int64_t>> statsAfter = StatsSnapshot();
  for (size_t i = 0; i < statsAfter.size(); ++i) {
    if (std::string(statsAfter[i].first).rfind("net_", 0) == 0) {
      stats[statsAfter[i].first] = statsAfter[i].second - statsBefore[i].second;
    }
  }
  out["stats"] = stats;
  return out;
}

// Moves `bytes` over each of `send_fds` and from each of `recv_fds` (blocking TCP sockets), one
// thread per socket, in writes and reads of 4 MiB; seconds from the first byte to the last.
double RawSocketTransfer(const std::vector<int>& send_fds, const std::vector<int>& recv_fds,
                         int64_t bytes) {
  nb::gil_scoped_release release;
  constexpr int64_t kChunk = 4 << 20;
  std::vector<std::thread> threads;
  std::atomic<bool> failed{false};
  const Clock::time_point t0 = Clock::now();
  for (int fd : send_fds) {
    threads.emplace_back([&, fd]() {
      std::vector<char> buf(static_cast<size_t>(kChunk), 1);
      for (int64_t left = bytes; left > 0;) {
        const ssize_t w = send(fd, buf.data(), size_t(std::min(left, kChunk)), MSG_NOSIGNAL);
        if (w <= 0) {
          failed.store(true);
          return;
        }
        left -= w;
      }
    });
  }
  for (int fd : recv_fds) {
    threads.emplace_back([&, fd]() {
      std::vector<char> buf(static_cast<size_t>(kChunk));
      for (int64_t left = bytes; left > 0;) {
        const ssize_t r = recv(fd, buf.data(), size_t(std::min(left, kChunk)), 0);
        if (r <= 0) {
          failed.store(true);
          return;
        }
        left -= r;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (failed.load()) throw nb::value_error("raw_socket_transfer: a socket failed");
  return seconds;
}

}  // namespace

void BindProxy(nb::module_& m) {
  m.def(
      "count_nodes", [](const std::vector<std::string>& keys) { return comm::CountNodes(keys); },
      nb::arg("keys"),
      "The nodes the runtimes plan a group with, from each rank's host in rank order "
      "(ffi/comm/group.h: CountNodes).");
  m.def("set_net_helper_poll_ms", &comm::tcp::SetHelperPollTimeoutMs, nb::arg("ms"),
        "How long the network interface's helper threads wait in poll() when nothing rings "
        "them (ms; the default 100 for 0 or less): tests raise it so an event nothing rings for "
        "shows as a stall.");
  m.def("raw_socket_transfer", &RawSocketTransfer, nb::arg("send_fds"), nb::arg("recv_fds"),
        nb::arg("bytes"),
        "Sends `bytes` on each of `send_fds` and receives `bytes` from each of `recv_fds` "
        "(connected blocking TCP sockets), one thread per socket, 4 MiB per call; returns the "
        "seconds (benchmarks: the raw socket bandwidth beside the proxy's).");
  m.def(
      "run_net_proxy", &RunNetProxy, nb::arg("session"), nb::arg("process"), nb::arg("group"),
      nb::arg("endpoints"), nb::arg("host_of_rank"), nb::arg("local_ranks"), nb::arg("program"),
      nb::arg("step_bytes"), nb::arg("timeout_s") = 10.0, nb::arg("stop_after") = -1,
      nb::arg("verify") = true, nb::arg("net_threads") = 2, nb::arg("drain_wait") = true,
      nb::arg("recv_delay_us") = 0, nb::arg("net_streams") = 0, nb::arg("hold_channel") = -1,
      nb::arg("trace_dir") = "", nb::arg("trace_events") = 0, nb::arg("net") = "",
      nb::arg("abort_at_stop") = false,
      "Runs the network proxy for this process's ranks `local_ranks` with a host-memory "
      "stand-in for their kernels: `program[i]` lists local rank i's proxy ops (the planner's "
      "dicts: channel, protocol, nsteps, recv_peers, send_peers); every send step carries "
      "data the receiver checks. The proxy's timeout is `timeout_s`, a stand-in gives up "
      "after twice that without progress (so the proxy's own checks fire first). "
      "`endpoints[r]`: the 'host:port' of rank r's process (its socket listener); "
      "`host_of_rank[r]`: its host. Returns {'conns': [(channel, from, to, "
      "steps the stand-in moved, steps the proxy moved)] per connection, 'seconds': the "
      "stand-in's time from its first step to its last, 'bytes': bytes the proxy moved, "
      "'stats': the net_* runtime counters it added (runtime_stats)}. "
      "`stop_after` >= 0: the stand-in stops after that many steps and the call returns {} "
      "with the connections left open (fault tests). `verify` False: only each step's first "
      "and last words are written and checked (benchmarks). `net_threads`: the TCP backend's "
      "helper threads (JAX_RCCL_NET_THREADS). `drain_wait` False: stop the proxy as soon as the "
      "stand-in posted its last step (Stop must ship the rest); `recv_delay_us`: the stand-in "
      "waits that long before it frees each received step (a slow receiver); `net_streams`: the "
      "TCP "
      "streams each way per pair of ranks (JAX_RCCL_NET_STREAMS); `hold_channel`: the "
      "stand-in takes none of that channel's received steps until every other connection of "
      "its rank is done (a channel whose receiver lags behind the others); `trace_dir`: the "
      "proxy writes its timeline there when it stops (JAX_RCCL_NET_TRACE), its last `trace_events` "
      "events (0: the runtime's count); `net`: the network (auto, socket, ucx; empty: "
      "JAX_RCCL_NET's); `abort_at_stop`: with `stop_after`, the stand-in then aborts its proxy "
      "from outside once the proxy idles (its connections must reset). The result's "
      "'transports' says how each connection moved its bytes.");
  m.def(
      "send_failure_notices",
      [](uint64_t group, int process, const std::string& session,
         const std::vector<std::pair<int, std::string>>& peers, int code, const std::string& text,
         double timeout_s, bool primary) {
        std::vector<comm::NoticePeer> to;
        for (const auto& [p, endpoint] : peers) to.push_back(comm::NoticePeer{p, endpoint});
        Check(code > int(Code::kOk) && code <= int(Code::kSystem), "code: a failure's code");
        const auto deadline =
            Clock::now() + std::chrono::microseconds(int64_t(std::max(0.0, timeout_s) * 1e6));
        nb::gil_scoped_release release;
        return comm::SendNotices(group, process, session, to, Status(Code(code), text), primary,
                                 deadline);
      },
      nb::arg("group"), nb::arg("process"), nb::arg("session"), nb::arg("peers"), nb::arg("code"),
      nb::arg("text"), nb::arg("timeout_s") = 1.0, nb::arg("primary") = true,
      "Posts a failure notice (ffi/comm/notice.h) of `code` and `text` as process `process` of "
      "`group` to each of `peers` ((process, 'host:port') of its listener) within `timeout_s` "
      "(`primary`: the sender's own finding); returns how many took it.");
  m.def(
      "take_failure_notice",
      [](uint64_t group, int process) -> nb::object {
        Status s;
        {
          nb::gil_scoped_release release;
          s = comm::TakeNotice(group, process);
        }
        if (s.ok()) return nb::none();
        return nb::make_tuple(int(s.code()), s.message());
      },
      nb::arg("group"), nb::arg("process"),
      "The failure notices for process `process` of `group` that this process's listener "
      "holds, taken: the primary one's (else the first's) (code, text), or None.");
  m.def(
      "await_failure_notice_from",
      [](uint64_t group, int process, int from, int ms) -> nb::object {
        Status s;
        {
          nb::gil_scoped_release release;
          s = comm::AwaitNoticeFrom(group, process, from, ms);
        }
        if (s.ok()) return nb::none();
        return nb::make_tuple(int(s.code()), s.message());
      },
      nb::arg("group"), nb::arg("process"), nb::arg("from_process"), nb::arg("ms"),
      "The failure notice of process `from_process` for process `process` of `group` that comes "
      "within `ms` milliseconds, (code, text), or None; the others taken meanwhile are dropped.");
  m.def("set_ucx_library", &comm::SetUcxLibrary, nb::arg("name"),
        "The library the UCX backend loads (empty: libucp.so.0): a test names one that does not "
        "exist to run a process where UCX cannot be loaded.");
}

}  // namespace jax_rccl
