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
    assert back.model == "tiny-gemma3"
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
        "do_sample": 1, "picked_layers": [3, 1, 3, -2], "window": {"width": 100, "height": 900, "x": "left"},
        "temperature": True, "model": ["a", 3],
    }), encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        s = load_settings(p)
    assert s.seed == 7  # the good key survives
    assert s.theme == "system" and s.max_new_tokens == 64 and s.do_sample is False
    assert s.picked_layers == [1, 3] and s.temperature == 1.0 and s.model == ""
    assert s.window.width == 640 and s.window.height == 900 and s.window.x is None
    assert s.version == SETTINGS_VERSION
    for word in ("bogus", "max_new_tokens", "do_sample", "theme", "version 99", "temperature", "model"):
        assert word in caplog.text


def test_retired_keys_are_read_silently_and_not_written_again(tmp_path, caplog):
    """top_k and recent_models had no control in the window; a file that still holds them loads cleanly."""
    p = tmp_path / "settings.json"
    p.write_text(json.dumps({"version": 1, "theme": "light", "top_k": 20, "recent_models": ["smollm2", "x"],
                             "model": "smollm2"}), encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        s = load_settings(p)
    assert caplog.text == ""
    assert (s.theme, s.model) == ("light", "smollm2")
    save_settings(s, p)
    assert not {"top_k", "recent_models"} & set(json.loads(p.read_text(encoding="utf-8")))


def test_field_types_are_checked_from_the_resolved_hints():
    """Every field type of Settings/WindowGeometry has a check (a new field of a new type fails here first)."""
    import typing
    from dataclasses import fields, is_dataclass

    from kvinspect.core.settings import WindowGeometry, _check

    for cls in (Settings, WindowGeometry):
        hints = typing.get_type_hints(cls)
        for f in fields(cls):
            if is_dataclass(hints[f.name]):
                continue
            default = getattr(cls(), f.name)
            assert _check(default, hints[f.name]) == default, f.name
    hints = typing.get_type_hints(WindowGeometry)
    assert _check(None, hints["x"]) is None and _check(5, hints["x"]) == 5
    for bad in ("5", True, 1.5):
        try:
            _check(bad, hints["x"])
        except TypeError as exc:
            assert "int | None" in str(exc)
        else:
            raise AssertionError(bad)


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


def test_run_on_is_remembered_and_checked(tmp_path, caplog):
    s = Settings(run_on="ssh", ssh_host="me@gpu1", ssh_python="~/venv/bin/python")
    back = load_settings(save_settings(s, tmp_path / "settings.json"))
    assert (back.run_on, back.ssh_host, back.ssh_python) == ("ssh", "me@gpu1", "~/venv/bin/python")
    p = tmp_path / "bad.json"
    p.write_text(json.dumps({"run_on": "moon", "ssh_host": "gpu2"}), encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        bad = load_settings(p)
    assert bad.run_on == "local" and bad.ssh_host == "gpu2" and "run_on" in caplog.text


def test_a_settings_file_nested_too_deeply_gives_defaults_and_one_warning(tmp_path, caplog):
    p = tmp_path / "settings.json"
    p.write_text("[" * 100_000 + "]" * 100_000)
    with caplog.at_level(logging.WARNING, logger="kvinspect.core.settings"):
        s = load_settings(p)  # no RecursionError: `kvinspect gui` and `view` start
    assert s == Settings()
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "nested deeper than 64 levels" in warnings[0] and "\n" not in warnings[0]
    p.write_text('{"theme": ' + "[" * 70 + "]" * 70 + "}")
    assert load_settings(p) == Settings()


def test_a_settings_path_that_is_a_folder_leaks_no_temporary_file(tmp_path, caplog):
    p = tmp_path / "settings.json"
    p.mkdir()
    with caplog.at_level(logging.WARNING, logger="kvinspect.core.settings"):
        for _ in range(3):
            assert save_settings(Settings(), p) is None
    assert sorted(x.name for x in tmp_path.iterdir()) == ["settings.json"] and not any(p.iterdir())
    assert "it is a folder" in caplog.records[-1].getMessage()
    # A value that cannot be UTF-8 (a lone surrogate from a damaged file) fails the write, leaving nothing behind.
    q = tmp_path / "other" / "settings.json"
    s = Settings()
    s.system_prompt = "bad\ud800"
    assert save_settings(s, q) is None and list(q.parent.iterdir()) == []
