"""Screenshots of the viewer, export, compare and follow modes (not a test: run it, then look at them).

    QT_QPA_PLATFORM=offscreen .venv/bin/python tests/gui/screenshots.py [--out artifacts] [--model tiny-gemma3]

Writes ``viewer-replay``, ``viewer-damaged``, ``export-dialog``, ``compare``, ``follow`` PNGs, in the
dark and the light theme, at 1280×800, from real runs on a tiny model (and SmolLM2 with
``--model smollm2``). Everything goes through the same public methods a user's clicks reach.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
_TMP = Path(tempfile.mkdtemp(prefix="kvinspect-shots-"))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("KVINSPECT_DATA_DIR", str(_TMP / "data"))
os.environ.setdefault("KVINSPECT_CONFIG_DIR", str(_TMP / "config"))

TURNS = ["Hello! What does a KV cache store? Please explain it in detail.",
         "Why does a sliding-window layer stop growing?", "And what does the full-attention layer keep?"]


def pump(app, until=None, timeout=120.0) -> None:
    end = time.time() + timeout
    while time.time() < end:
        app.processEvents()
        if until is None or until():
            if until is None:
                time.sleep(0.05)
                app.processEvents()
            return
        time.sleep(0.02)
    raise TimeoutError("gave up waiting")


def settle(app, win) -> None:
    for _ in range(3):
        win.refresh(force=True)
        pump(app)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "artifacts"))
    ap.add_argument("--model", default="tiny-gemma3")
    ap.add_argument("--themes", default="dark,light")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    from kvinspect.core.model.loading import load_model
    from kvinspect.core.session.chat import ChatSession
    from kvinspect.core.session.options import SessionOptions
    from kvinspect.core.session.runner import run_script
    from kvinspect.core.session.script import ChatScript, GenerationSettings
    from kvinspect.core.settings import Settings
    from kvinspect.gui.app import create

    loaded = load_model(args.model, device="cpu")
    tokens = 40 if args.model.startswith("tiny") else 24
    run = _TMP / "run"
    run_script(loaded, ChatScript(turns=TURNS, settings=GenerationSettings(max_new_tokens=tokens)), run)
    data = (run / "trace.jsonl").read_bytes()
    cut = _TMP / "cut-trace.jsonl"
    cut.write_bytes(data[: data.rindex(b'{"type":"turn"') + 60])
    tag = "" if args.model == "tiny-gemma3" else f"-{args.model}"

    for theme in args.themes.split(","):
        s = Settings()
        s.window.width, s.window.height = 1280, 800
        s.theme = theme
        app, win = create(settings=s, persist=False)
        pump(app)

        # Viewer: the replay slider half-way through turn 2.
        win.open_trace(str(run))
        pump(app, lambda: win.viewer.mode == "view")
        rec = win.record
        win.viewer.set_step(rec.turns[1].first_step + (rec.turns[1].end_step - rec.turns[1].first_step) // 2)
        settle(app, win)
        win.save_screenshot(str(out / f"viewer-replay{tag}-{theme}.png"))

        # Export dialog, after an export of that trace.
        dlg = win.export_report_dialog()
        dlg.folder.setText(str(_TMP / f"bundle-{theme}"))
        done = []
        dlg.finished_export.connect(done.append)
        dlg.start()
        pump(app, lambda: bool(done), timeout=300)
        pump(app)
        dlg.grab().save(str(out / f"export-dialog{tag}-{theme}.png"))
        dlg.close()

        # A damaged file: the banner.
        win.open_trace(str(cut))
        pump(app, lambda: win.viewer.path == cut)
        settle(app, win)
        win.save_screenshot(str(out / f"viewer-damaged{tag}-{theme}.png"))

        # Follow: another writer appends while the window follows its folder.
        folder = _TMP / f"follow-{theme}"
        folder.mkdir()
        win.follow_trace(str(folder))
        with ChatSession(loaded, SessionOptions(settings=GenerationSettings(max_new_tokens=tokens)),
                         trace_path=folder / "trace.jsonl") as sess:
            for text in TURNS[:2]:
                sess.run_turn(text)
                def caught_up():
                    r = win.viewer.record
                    return r is not None and len(r.turns) == len(sess.record.turns) and r.turns[-1].status != "running"

                pump(app, caught_up)
            # Mid-turn 3: the shot is taken from inside the writer's token callback, as the file grows.
            shot = out / f"follow{tag}-{theme}.png"
            seen, taken = [], []

            def on_token(text, first=sess.record.n_steps):
                seen.append(text)
                if len(seen) >= tokens // 2 and not taken:
                    taken.append(True)
                    sess.pipeline.flush()  # what the session does every 0.5 s, at its next forward
                    pump(app, lambda: len(win.viewer.record.turns) == 3 and win.viewer.record.n_steps > first + 5)
                    time.sleep(1.1)
                    settle(app, win)
                    win.save_screenshot(str(shot))

            t3 = sess.run_turn(TURNS[2], on_token=on_token)
            assert taken and shot.exists(), f"no follow screenshot: {t3.status} {t3.error}"
        win.back_to_live()

        # Compare: the chat's turns under four configurations.
        assert win.load(args.model, device="cpu")
        pump(app, lambda: win.info is not None and not win.controller.busy, timeout=300)
        for text in TURNS[:2]:
            win.chat.max_new.setValue(12)
            win.chat.input.setPlainText(text)
            win.chat.send()
            assert win.controller.busy == "turn", win.errors.messages
            pump(app, lambda: not win.controller.busy, timeout=300)
        cw = win.open_compare()
        pump(app, lambda: not cw.pending, timeout=300)
        cw.set_selected(["dynamic", "static", "nocache"])
        cw.extra.setText("recreate")
        cw.repeat.setValue(2)
        cw.max_new.setValue(12)
        fin = []
        cw.runFinished.connect(fin.append)
        assert cw.start(), cw.status.text()
        pump(app, lambda: bool(fin), timeout=900)
        cw.resize(1280, 800)
        pump(app)
        cw.grab().save(str(out / f"compare{tag}-{theme}.png"))
        cw.close()
        win.close()
        pump(app)
    print(f"screenshots in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
