"""Topology dicts (TopologyView field names) shared by the cost-model and selection tests."""


def _node_of_8(arch, intra_link, ll128):
    """One node of 8 `arch` GPUs over `intra_link`, 16 channels of 20 GB/s."""
    return dict(
        nRanks=8,
        nNodes=1,
        arch=arch,
        intraLink=intra_link,
        interLink="net",
        bwIntra=20.0,
        bwInter=0.0,
        nChannels=16,
        ll128Enabled=ll128,
    )


# MI300X-like: gfx942 GPUs over XGMI. RCCL's rome models give these nodes "tuning=5"
# (tuning_model_5); LL128 is off.
MI300X = _node_of_8("gfx942", "xgmi", ll128=False)
# H100-like: sm90 GPUs over NVLink, LL128 on.
H100 = _node_of_8("sm90", "nvlink", ll128=True)
