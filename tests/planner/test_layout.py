"""Work layout of one launch and the FIFO ring's bookkeeping (after RCCL enqueue.cc uploadWork,
waitWorkFifoAvailable, rollingLess32, rollingMin32). Worked out by hand from the reference."""

import pytest
from jax_rccl._jax_rccl import internal

from jax_rccl import planner

U32 = 1 << 32


def brief(writes):
    """(slot, channel, index, work_next or ('acks', done_acks)) per write, by slot."""
    out = []
    for w in sorted(writes, key=lambda w: w["slot"]):
        tail = ("acks", w["done_acks"]) if w["is_last"] else w["work_next"]
        out.append((w["slot"], w["channel"], w["index"], tail))
    return out


def writes_2013(slot0, head):
    """brief() of the works of channels 0, 2, 3 holding 2, 1, 3 works, laid out from ring slot
    `slot0` with the FIFO's head at `head` (work_next is relative to the head, done_acks is not):
      ch 0: slot0 -> next at slot0 + 3 (workNext 3); slot0 + 3 last, acks head + 4
      ch 2: slot0 + 1 last, acks head + 2
      ch 3: slot0 + 2 -> + 4; + 4 -> + 5; slot0 + 5 last, acks head + 6"""
    return [
        (slot0, 0, 0, 3),
        (slot0 + 1, 2, 0, ("acks", head + 2)),
        (slot0 + 2, 3, 0, 4),
        (slot0 + 3, 0, 1, ("acks", head + 4)),
        (slot0 + 4, 3, 1, 5),
        (slot0 + 5, 3, 2, ("acks", head + 6)),
    ]


def test_persistent_layout():
    # Channels 0, 2, 3 hold 2, 1, 3 works: channelCount 3, first works at 0, 1, 2 (one per
    # channel with work, in channel order); later works from slot 3 on, channel by channel.
    #   ch 0: slot 0 -> next at 3 (workNext 3); slot 3 last, acks 4
    #   ch 2: slot 1 last, acks 2
    #   ch 3: slot 2 -> 4; slot 4 -> 5; slot 5 last, acks 6
    works = internal.layout_persistent([2, 0, 1, 3])
    assert brief(works) == writes_2013(0, 0)
    assert not any(w["in_fifo"] for w in works)


def test_fifo_layout_no_wrap():
    # Same plan at sent = 10 in a ring of 256: head 10, offsets relative to the head.
    #   ch 0: 10 -> 13 (workNext 3), 13 last (acks 14); ch 2: 11 last (acks 12);
    #   ch 3: 12 -> 14 (4) -> 15 (5), 15 last (acks 16). sent becomes 16.
    d = internal.layout_fifo([2, 0, 1, 3], 256, 10)
    assert (d["ix_head"], d["wait_acked"], d["sent"], d["placed"]) == (10, 16, 16, True)
    assert brief(d["writes"]) == writes_2013(10, 10)
    assert all(w["in_fifo"] for w in d["writes"] if w["is_last"])
    assert d["channel_sent"][:4] == [14, 10, 12, 16]  # channel 1 untouched


def test_fifo_first_works_never_straddle_the_end():
    # sent = 254, depth 256, 3 channels: first works would take 254, 255, 256 -> (254+2)&255 = 0
    # < 254, so sent rounds up to 256; slots 254 and 255 are skipped (counted as sent).
    #   head 256 (ring slot 0): ch 0: 0 -> 3, 3 last (acks 260); ch 2: 1 (acks 258);
    #   ch 3: 2 -> 4 -> 5 (acks 262). wait_acked = 256 + 6.
    d = internal.layout_fifo([2, 0, 1, 3], 256, 254)
    assert (d["ix_head"], d["wait_acked"], d["sent"]) == (256, 262, 262)
    assert brief(d["writes"]) == writes_2013(0, 256)
    # The skipped slots count as consumed: every channel quiesced at 254 (done == sent), so a
    # poll with sent = 256 moves the acked minimum (and the quiesced channels) to 256.
    p = internal.fifo_poll(256, 256, 254, [254] * 128, [254] * 128)
    assert p["ackd_min"] == 256
    assert set(p["channel_sent"]) == {256} and set(p["done_live"]) == {256}


def test_fifo_chain_wraps_with_negative_offsets():
    # sent = 250: first works at 250, 251, 252 ((250+2)&255 = 252 >= 250: no skip).
    # ch 0 has 8 works: 250, then 253, 254, 255, 256, 257, 258, 259 (ring 0..3).
    #   workNext = (next & 255) - 250: 3, 4, 5, 0-250 = -250, -249, -248, -247; acks 260.
    #   ch 1: 251 (acks 252); ch 2: 252 (acks 253). sent = 260.
    d = internal.layout_fifo([8, 1, 1], 256, 250)
    assert (d["ix_head"], d["sent"], d["wait_acked"]) == (250, 260, 260)
    chain = [w for w in d["writes"] if w["channel"] == 0]
    assert [w["slot"] for w in chain] == [250, 253, 254, 255, 0, 1, 2, 3]
    assert [w.get("work_next") for w in chain[:-1]] == [3, 4, 5, -250, -249, -248, -247]
    assert chain[-1]["done_acks"] == 260
    assert d["channel_sent"][:3] == [260, 252, 253]


def test_fifo_without_room_places_nothing():
    # Four channels, one work each, at sent = 300: wait_acked = 304. With ackd_min = 40,
    # ackd_min + depth = 296 < 304: the caller must poll first; nothing moves.
    d = internal.layout_fifo([1, 1, 1, 1], 256, 300, ackd_min=40, channel_sent=[300] * 128)
    assert (d["placed"], d["writes"], d["sent"], d["wait_acked"]) == (False, [], 300, 304)
    assert set(d["channel_sent"]) == {300}
    # ackd_min = 48: 48 + 256 = 304, not before 304 -> room.
    d = internal.layout_fifo([1, 1, 1, 1], 256, 300, ackd_min=48, channel_sent=[300] * 128)
    assert d["placed"] and len(d["writes"]) == 4


def test_fifo_has_room_rolls_over():
    assert internal.fifo_has_room(256, 100, 356)
    assert not internal.fifo_has_room(256, 100, 357)
    # ackd_min + depth wraps to 0: 16 is after 0 -> no room; 0 -> room.
    assert not internal.fifo_has_room(256, U32 - 256, 16)
    assert internal.fifo_has_room(256, U32 - 256, 0)
    assert internal.fifo_has_room(256, U32 - 300, U32 - 100)


def test_fifo_poll_min_over_busy_channels():
    # channel_sent [10, 20, 30], done [10, 15, 30]: channel 1 is busy (15 != 20):
    # ackd = rollingMin(sent 30, 15) = 15; quiesced channels (0, 2 and the idle 3..127 at 0) move
    # to 15; the busy one keeps its counters.
    p = internal.fifo_poll(256, 30, 0, [10, 20, 30], [10, 15, 30])
    assert p["ackd_min"] == 15
    assert p["channel_sent"][:4] == [15, 20, 15, 15]
    assert p["done_live"][:4] == [15, 15, 15, 15]
    # Across the wrap: sent = 5 (wrapped), a busy channel acked U32-16 -> that is the minimum.
    p = internal.fifo_poll(256, 5, 0, [U32 - 8], [U32 - 16])
    assert p["ackd_min"] == U32 - 16


@pytest.mark.parametrize("depth", [100, 128, 0])
def test_fifo_depth_is_validated(depth):
    with pytest.raises(ValueError, match="power of two"):
        internal.layout_fifo([1], depth, 0)


def test_plan_layouts_match_channels():
    # A real plan: 1 MiB all_reduce on 43 channels, one work each -> persistent slots 0..42 all
    # last, acks 1..43; in a FIFO at 0 the same.
    topo = planner.Topology.preset("mi300x-8")
    p = planner.plan(
        [planner.Task("all_reduce", 1 << 18)], topo, algorithm="Ring", protocol="Simple"
    )
    works = p.layout(0)
    assert len(works) == 43
    assert [w["done_acks"] for w in works] == list(range(1, 44))
    f = p.layout(0, fifo_depth=256, fifo_sent=0)
    assert f["sent"] == 43 and len(f["writes"]) == 43
