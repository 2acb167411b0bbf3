"""Topology: what the planner knows of the machine, and named presets."""

from __future__ import annotations

import dataclasses
from typing import Any

from jax_rccl import _jax_rccl

# Connection buffer bytes per protocol (LL, LL128, Simple) of the project's kernels, after RCCL:
# LL = 8 lines/thread x 256 threads x 8 steps x 16 B; LL128 = 28 elems/thread x 256 threads x
# 8 steps x 8 B; Simple = 4 MiB.
DEFAULT_BUFF_SIZES = (262144, 458752, 4194304)

_ARCHES = ("cpu", "gfx90a", "gfx942", "sm80", "sm90")
_LINKS = ("loopback", "shm", "pcie", "xgmi", "nvlink", "net", "socket")


@dataclasses.dataclass(frozen=True)
class Topology:
    """A communicator reduced to values: ranks, nodes, architecture, links, channels, buffers.

    ``nranks`` ranks on ``nnodes`` nodes (as many on each); ``arch`` is ``"cpu"`` or a GPU
    architecture; ``link`` joins the ranks of a node, ``inter_link`` the nodes; ``bw_intra`` /
    ``bw_inter`` are the GB/s one channel gets inside a node / between nodes; ``nchannels`` the
    channels of collectives, ``p2p_nchannels`` those of point-to-point transfers; ``buff_sizes``
    the connection buffers of the LL, LL128 and Simple protocols. A preset
    (``Topology.preset("mi300x-8")``) names a machine; ``Topology.from_native(
    jax_rccl.runtime_topology(n))`` is what the CPU runtime plans a group of n devices with.

    Example:
        >>> import jax_rccl
        >>> from jax_rccl import planner
        >>> topo = planner.Topology.from_native(jax_rccl.runtime_topology(8))
        >>> topo.arch, topo.nranks, topo.nchannels
        ('cpu', 8, 2)
        >>> planner.Topology.preset("mi300x-8").replace(nchannels=8).nchannels
        8
    """

    nranks: int
    nnodes: int = 1
    arch: str = "cpu"
    link: str = "loopback"
    inter_link: str = "net"
    bw_intra: float = 8.0
    bw_inter: float = 0.0
    nchannels: int = 2
    p2p_nchannels: int = 2
    p2p_nchannels_per_peer: int = 1
    buff_sizes: tuple[int, int, int] = DEFAULT_BUFF_SIZES
    p2p_chunk_size: int = 524288
    ll128: bool = False
    tree_defined: bool = False
    pivot_a2a_bi_rings: int = 0
    work_fifo_depth: int = 262144
    direct_peers: bool = False

    def __post_init__(self) -> None:
        # Built: the types and names this dataclass converts, and the planner's rule for ranks
        # and nodes (local_ranks needs it). Every other rule is the planner's ValidateTopology,
        # which plan(), explain() and validate() apply.
        for name in ("nranks", "nnodes"):
            if not isinstance(getattr(self, name), int):
                raise ValueError(f"{name} must be an integer, got {getattr(self, name)!r}")
        _jax_rccl.validate_ranks_and_nodes(self.nranks, self.nnodes)
        if self.arch not in _ARCHES:
            raise ValueError(f"arch must be one of {', '.join(_ARCHES)}; got {self.arch!r}")
        for name in ("link", "inter_link"):
            if getattr(self, name) not in _LINKS:
                raise ValueError(
                    f"{name} must be one of {', '.join(_LINKS)}; got {getattr(self, name)!r}"
                )
        if len(tuple(self.buff_sizes)) != 3:
            raise ValueError("buff_sizes must hold 3 sizes: (ll, ll128, simple)")

    def validate(self) -> Topology:
        """Checks every field by the planner's rules (the check plan() and the cost model make);
        raises ValueError naming the field and the allowed values. Returns the topology."""
        _jax_rccl.validate_topology(self.to_native())
        return self

    @property
    def local_ranks(self) -> int:
        """Ranks per node."""
        return self.nranks // self.nnodes

    def replace(self, **changes: Any) -> Topology:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    def to_native(self) -> dict[str, Any]:
        """The dict the native planner takes (TopologyView field names)."""
        return {
            "nRanks": self.nranks,
            "nNodes": self.nnodes,
            "arch": self.arch,
            "intraLink": self.link,
            "interLink": self.inter_link,
            "bwIntra": float(self.bw_intra),
            "bwInter": float(self.bw_inter),
            "nChannels": self.nchannels,
            "p2pnChannels": self.p2p_nchannels,
            "p2pnChannelsPerPeer": self.p2p_nchannels_per_peer,
            "buffSizes": [int(s) for s in self.buff_sizes],
            "p2pChunkSize": self.p2p_chunk_size,
            "ll128Enabled": self.ll128,
            "treeDefined": self.tree_defined,
            "pivotA2ANumBiRings": self.pivot_a2a_bi_rings,
            "workFifoDepth": self.work_fifo_depth,
            "directPeers": self.direct_peers,
        }

    @staticmethod
    def from_native(d: dict[str, Any]) -> Topology:
        """The inverse of to_native(): a Topology from the runtime's dict."""
        return Topology(
            nranks=d["nRanks"],
            nnodes=d.get("nNodes", 1),
            arch=d.get("arch", "cpu"),
            link=d.get("intraLink", "loopback"),
            inter_link=d.get("interLink", "net"),
            bw_intra=d.get("bwIntra", 8.0),
            bw_inter=d.get("bwInter", 0.0),
            nchannels=d.get("nChannels", 2),
            p2p_nchannels=d.get("p2pnChannels", 2),
            p2p_nchannels_per_peer=d.get("p2pnChannelsPerPeer", 1),
            buff_sizes=tuple(d.get("buffSizes", DEFAULT_BUFF_SIZES)),
            p2p_chunk_size=d.get("p2pChunkSize", 524288),
            ll128=d.get("ll128Enabled", False),
            tree_defined=d.get("treeDefined", False),
            pivot_a2a_bi_rings=d.get("pivotA2ANumBiRings", 0),
            work_fifo_depth=d.get("workFifoDepth", 262144),
            direct_peers=d.get("directPeers", False),
        )

    @staticmethod
    def preset(name: str) -> Topology:
        """A named machine: see ``Topology.presets()``."""
        try:
            return _PRESETS[name]
        except KeyError:
            raise ValueError(
                f"unknown topology preset {name!r}; allowed: {', '.join(sorted(_PRESETS))}"
            ) from None

    @staticmethod
    def presets() -> list[str]:
        """The names ``Topology.preset`` takes, sorted."""
        return sorted(_PRESETS)


# Channel counts and per-channel bandwidths follow what RCCL/NCCL derive for these machines
# (RCCL's topology models and ncclTopoPostset; NCCL's graph search for H100). See docs/planner.md.
_PRESETS: dict[str, Topology] = {
    # 8 x MI300X (gfx942), all-to-all XGMI: 28 rings of 12 GB/s, doubled to 56 channels.
    "mi300x-8": Topology(
        nranks=8,
        arch="gfx942",
        link="xgmi",
        bw_intra=12.0,
        nchannels=56,
        p2p_nchannels=64,
        p2p_nchannels_per_peer=2,
    ),
    # Two nodes of 8 x MI300X with 8 NICs each: 64 channels of 5.25 GB/s.
    "mi300x-2x8": Topology(
        nranks=16,
        nnodes=2,
        arch="gfx942",
        link="xgmi",
        inter_link="net",
        bw_intra=5.25,
        bw_inter=5.25,
        nchannels=64,
        p2p_nchannels=64,
        p2p_nchannels_per_peer=2,
        p2p_chunk_size=131072,
    ),
    # 8 x MI250X GCDs (gfx90a): 4 rings of 63 GB/s, 16 channels.
    "mi250x-8": Topology(
        nranks=8,
        arch="gfx90a",
        link="xgmi",
        bw_intra=63.0,
        nchannels=16,
        p2p_nchannels=16,
        p2p_nchannels_per_peer=2,
    ),
    # 16 x MI250X GCDs without NICs: RCCL's pivot all-to-all model (3 bidirectional rings).
    "mi250x-16": Topology(
        nranks=16,
        arch="gfx90a",
        link="xgmi",
        bw_intra=42.0,
        nchannels=24,
        p2p_nchannels=32,
        p2p_nchannels_per_peer=2,
        tree_defined=True,
        pivot_a2a_bi_rings=3,
    ),
    # 8 x H100 SXM on NVSwitch: 24 channels of 30 GB/s; LL128 allowed on sm90.
    "h100-8": Topology(
        nranks=8,
        arch="sm90",
        link="nvlink",
        bw_intra=30.0,
        nchannels=24,
        p2p_nchannels=32,
        p2p_nchannels_per_peer=2,
        ll128=True,
    ),
    # 8 virtual CPU devices of one process: host memory, 2 channels.
    "cpu-8": Topology(
        nranks=8,
        arch="cpu",
        link="loopback",
        bw_intra=8.0,
        nchannels=2,
        p2p_nchannels=2,
        p2p_nchannels_per_peer=1,
    ),
}
