"""The window's settings file: round trip, tolerant load, env override. No Qt."""

from __future__ import annotations

import json
import logging

from kvinspect.core.settings import SETTINGS_VERSION, Settings, load_settings, save_settings, settings_path


def test_round_trip(tmp_path):
    s = Settings(theme="light", max_new_tokens=17, do_sample=True, temperature=0.7, policy="recreate")
    s.remember_model("tiny-gemma3")
    s.remember_model("smollm2")
    s.remember_model("tiny-gemma3")
    s.window.width, s.window.height, s.window.maximized, s.window.state = 1280, 800, True, "AAAA"
    p = save_settings(s, tmp_path / "settings.json")
    back = load_settings(p)
    assert back == s
    assert back.recent_models == ["tiny-gemma3", "smollm2"]
    assert json.loads(p.read_text())["version"] == SETTINGS_VERSION


def test_missing_file_gives_defaults(tmp_path):
    assert load_settings(tmp_path / "nope.json") == Settings()


def test_damaged_file_gives_defaults(tmp_path, caplog):
    p = tmp_path / "settings.json"
    p.write_text("{not json", encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        assert load_settings(p) == Settings()
    assert "not valid JSON" in caplog.text
    p.write_text("[1, 2]", encoding="utf-8")
    assert load_settings(p) == Settings()
    p.write_bytes(b"\xff\xfe\x00garbage")
    assert load_settings(p) == Settings()


def test_bad_keys_are_dropped_not_fatal(tmp_path, caplog):
    p = tmp_path / "settings.json"
    p.write_text(json.dumps({
        "version": 99, "theme": "purple", "max_new_tokens": "many", "seed": 7, "bogus": 1,
        "do_sample": 1, "recent_models": ["a", 3], "window": {"width": 100, "height": 900, "x": "left"},
        "picked_layers": [3, 1, 3, -2],
    }), encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        s = load_settings(p)
    assert s.seed == 7  # the good key survives
    assert s.theme == "dark" and s.max_new_tokens == 64 and s.do_sample is False
    assert s.recent_models == [] and s.picked_layers == [1, 3]
    assert s.window.width == 640 and s.window.height == 900 and s.window.x is None
    assert s.version == SETTINGS_VERSION
    for word in ("bogus", "max_new_tokens", "do_sample", "theme", "version 99"):
        assert word in caplog.text


def test_env_overrides_theme(tmp_path, monkeypatch):
    p = save_settings(Settings(theme="dark"), tmp_path / "s.json")
    monkeypatch.setenv("KVINSPECT_THEME", "light")
    assert load_settings(p).theme == "light"


def test_default_location_follows_config_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KVINSPECT_CONFIG_DIR", str(tmp_path / "cfg"))
    assert settings_path() == tmp_path / "cfg" / "settings.json"
    save_settings(Settings(seed=5))
    assert load_settings().seed == 5


def test_unwritable_location_does_not_raise(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert save_settings(Settings(), blocker / "sub" / "settings.json") is None
