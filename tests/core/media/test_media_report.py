"""An image run's bundle: report.md lists each image's span, hash and rows held; the rebuilt script carries the
pictures; --redact keeps spans and hashes and drops the file names."""

import json

from kvinspect.core.report.bundle import write_report
from kvinspect.core.session.runner import run_script
from kvinspect.core.session.script import load_script
from tests.conftest import load_vl
from tests.helpers import RESOURCES


def test_image_run_bundle(tmp_path):
    script = load_script(RESOURCES / "scripts" / "images.json")
    script.settings.max_new_tokens = 6
    run = run_script(load_vl(), script, tmp_path / "run")
    media = run.record.turns[-1].media
    write_report(run.trace, tmp_path / "bundle", plots_enabled=False)
    md = (tmp_path / "bundle" / "report.md").read_text()
    assert "## Images" in md
    for m in media:
        assert f"| {m['image'] + 1} | {m['turn'] + 1} | {m['first']}–{m['last']} | 16 | `#{m['hash']}` |" in md
    rebuilt = json.loads((tmp_path / "bundle" / "script.json").read_text())
    assert [t["images"] for t in rebuilt["turns"]] == script.images
    assert "other generation settings" not in md  # a turn's pictures are not a setting
    write_report(run.trace, tmp_path / "redacted", redact=True, plots_enabled=False)
    trace = (tmp_path / "redacted" / "trace.jsonl").read_text()
    assert "gradient.png" not in trace and "checker.png" not in trace
    assert all(m["hash"] in trace for m in media)
