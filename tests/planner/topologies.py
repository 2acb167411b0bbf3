"""Topology dicts (TopologyView field names) shared by the cost-model and selection tests."""

# MI300X-like: one node of 8 gfx942 GPUs over XGMI, 16 channels of 20 GB/s. RCCL's rome models
# give these nodes "tuning=5" (tuning_model_5); LL128 is off.
MI300X = dict(
    nRanks=8,
    nNodes=1,
    arch="gfx942",
    intraLink="xgmi",
    interLink="net",
    bwIntra=20.0,
    bwInter=0.0,
    nChannels=16,
    ll128Enabled=False,
)
# H100-like: one node of 8 sm90 GPUs over NVLink, 16 channels of 20 GB/s, LL128 on.
H100 = dict(
    nRanks=8,
    nNodes=1,
    arch="sm90",
    intraLink="nvlink",
    interLink="net",
    bwIntra=20.0,
    bwInter=0.0,
    nChannels=16,
    ll128Enabled=True,
)
