"""The peer comparison (peers.py) runs both sides and reports a ratio of real times."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
pytest.importorskip("linformer")

from tests.benchmarks import peers


@pytest.mark.parametrize("peer", sorted(peers.PEERS))
@pytest.mark.parametrize("backward", [False, True])
def test_compare_times_both_sides(peer, backward):
    ratio, ours_s, theirs_s, flops = peers.compare(peer, 512, backward, turns=1, min_run_time=0.01)
    assert ours_s > 0 and theirs_s > 0 and flops > 0
    assert ratio == pytest.approx(theirs_s / ours_s)


def test_unknown_peer_is_refused():
    with pytest.raises(SystemExit, match="unknown peer"):
        peers.main(["--peers", "NoSuchAttention", "--seq-lens", "16"])


def test_bad_lengths_are_refused():
    for text in ("2048,abc", "0"):
        with pytest.raises(SystemExit, match="--seq-lens"):
            peers.main(["--seq-lens", text])
