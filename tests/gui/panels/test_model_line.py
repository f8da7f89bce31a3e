"""The toolbar's kind summary: what the config asks before a turn, what the cache did after one."""

from __future__ import annotations

from tests.gui.helpers import load, send


def test_gemma3n_shared_layers_show_as_shared_after_a_turn(qtbot, window):
    info = load(qtbot, window, "tiny-gemma3n")
    before = window.model_label.text()
    assert "[S×2, F, S×2, F]" in before and "shared" not in before  # the config's layer_types
    send(qtbot, window, "Hi there", max_new_tokens=2)
    after = window.model_label.text()
    # As the heatmap's layer axis: layers 3-5 store nothing and read layers 1 (sliding) and 2 (full).
    assert "[S×2, F, R×3]" in after and "shared: layers 3,4 read 1; 5 reads 2" in after
    assert info.name in after and "window 32" in after
