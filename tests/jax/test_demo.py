"""`make demo` (jax_rccl/demo.py): data-parallel training whose loss goes down."""

from __future__ import annotations

import pytest

from jax_rccl import demo


@pytest.mark.parametrize("devices", [4, 8])
def test_demo_loss_decreases_and_matches_jax_lax(devices, capsys):
    out = demo.run(["--devices", str(devices), "--steps", "12", "--batch", "256"])
    losses = out["losses"]
    assert len(losses) == 12
    # Training works: every step lowers the loss, and 12 steps more than halve it.
    assert all(b < a for a, b in zip(losses, losses[1:], strict=False)), losses
    assert losses[-1] < 0.5 * losses[0], losses
    # The same loop with jax.lax.pmean ends with the same parameters and losses.
    assert out["match"], out["max_diff"]
    assert losses == pytest.approx(out["lax_losses"], rel=1e-5)
    printed = capsys.readouterr().out
    assert "plan of the gradient all-reduce" in printed
    assert "match" in printed


def test_demo_main_returns_zero(capsys):
    assert demo.main(["--devices", "2", "--steps", "3", "--batch", "64", "--hidden", "16"]) == 0
