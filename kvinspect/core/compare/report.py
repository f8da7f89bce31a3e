"""``compare.json`` (stable field names, see docs/compare.md), ``compare.md`` and the plots of a comparison."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from kvinspect.core import env
from kvinspect.core.compare.correctness import correctness
from kvinspect.core.compare.lengths import sweep_max_cache_len
from kvinspect.core.compare.markdown import markdown
from kvinspect.core.compare.metrics import MEMORY_LABEL
from kvinspect.core.compare.plan import COMPARE_FORMAT, COMPARE_VERSION, RUNS_DIR, CompareResult
from kvinspect.core.compare.repeat_stats import (
    length_points,
    per_turn,
    steady_compiled_graphs,
    summarize_runs,
    warmup_summary,
)
from kvinspect.core.report.renderer import NO_RENDERER, Renderer
from kvinspect.core.text_safety import json_dumps_utf8

JSON_NAME = "compare.json"
MD_NAME = "compare.md"
PLOTS_DIR = "plots"


@dataclass
class CompareFiles:
    json: Path
    markdown: Path
    plots: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def baseline_name(result: CompareResult) -> str | None:
    """Ratios are taken against ``dynamic`` when it ran, else against the first configuration that ran."""
    ran = [c for c in result.configs if c.runs or c.lengths]
    for c in ran:
        if c.name == "dynamic":
            return c.name
    return ran[0].name if ran else None


def recompile_limit(cr) -> dict | None:
    """Did dynamo hit its recompile limit in any run of this configuration (then the rest ran eagerly)?"""
    runs = [*cr.warmups, *cr.runs, *cr.length_warmups, *cr.lengths]
    hits = [(r.dir, h) for r in runs for h in r.recompile_limit_hits]
    if cr.stress and cr.stress.get("run"):
        hits += [(cr.stress["run"]["dir"], h) for h in cr.stress["run"].get("recompile_limit_hits") or []]
    if not hits:
        return None
    first = hits[0][1]
    return {**first, "count": len(hits), "runs": list(dict.fromkeys(d for d, _ in hits))}


def build_report(result: CompareResult) -> dict:
    """The compare.json document (without ``plots``, which :func:`write_report` adds)."""
    plan = result.plan
    configs = []
    for cr in result.configs:
        summary = summarize_runs(cr.runs)
        configs.append({
            **cr.config.to_dict(),
            "name": cr.name,
            "config": cr.config.name,
            "env": cr.env,
            "status": cr.status,
            "reason": cr.reason,
            "max_cache_len": cr.max_cache_len,
            "summary": summary,
            "per_turn": per_turn(cr.runs),
            "warmup": warmup_summary(cr.warmups, summary),
            "steady_compiled_graphs": steady_compiled_graphs(cr.runs) if cr.config.compile else None,
            "recompile_limit": recompile_limit(cr),
            "runs": [r.to_dict() for r in cr.runs],
            "warmup_runs": [r.to_dict() for r in cr.warmups],
        })
    stress = None
    if plan.turns_until_failure:
        stress = {
            "max_turns": plan.turns_until_failure,
            "configs": [{"name": c.name, **c.stress} for c in result.configs if c.stress is not None],
        }
    lengths = None
    if plan.prompt_lengths:
        lengths = {
            "lengths": list(plan.prompt_lengths),
            "prompt_tokens": {str(k): v for k, v in sorted(result.length_prompts.items())},
            "max_cache_len": sweep_max_cache_len(plan),
            "max_new_tokens": plan.settings.max_new_tokens,
            "skipped": list(result.lengths_skipped),
            "configs": [
                {"name": c.name, "points": length_points(c), "runs": [r.to_dict() for r in c.lengths],
                 "warmup_runs": [r.to_dict() for r in c.length_warmups]}
                for c in result.configs if c.lengths or c.length_warmups
            ],
        }
    script = plan.script
    unmeasured = result.unmeasured()
    return {
        "format": COMPARE_FORMAT,
        "version": COMPARE_VERSION,
        "created": result.created,
        "wall_s": result.wall_s,
        "cancelled": result.cancelled,
        "command": plan.command,
        "model": result.model,
        "device": result.device,
        "memory_kind": result.memory_kind,
        "memory_label": MEMORY_LABEL[result.memory_kind],
        "versions": env.versions(),
        "machine": env.machine(),
        "plan": plan.to_dict(),
        "script": None if script is None else {"system": script.system, "turns": list(script.turns)},
        "baseline": baseline_name(result),
        "correctness": correctness(result.configs, plan.baseline, sampling=bool(plan.settings.do_sample)),
        "nothing_measured": unmeasured[0] if unmeasured else None,
        "configs": configs,
        "stress": stress,
        "lengths": lengths,
        "notes": list(result.notes),
        "runs_dir": RUNS_DIR,
        "environments": list(result.environments),
        "diff": list(result.diffs),
    }


def write_report(result: CompareResult, out_dir: str | os.PathLike | None = None, *, plots: bool = True,
                 formats: tuple[str, ...] = ("png", "svg"), renderer: Renderer | None = None) -> CompareFiles:
    """Write compare.json, the plots and compare.md into ``out_dir`` (default: the run's folder).

    Exporting to another folder copies the run folders too, so the export stands on its own.
    The plots are drawn by ``renderer`` (:class:`~kvinspect.core.report.renderer.Renderer`, e.g.
    :func:`kvinspect.child_render.render_in_child`); without one they are skipped with a note.
    """
    return write_report_doc(build_report(result), out_dir if out_dir is not None else result.out_dir,
                            src_dir=result.out_dir, plots=plots, formats=formats, renderer=renderer)


def _rel(p: Path, base: Path) -> str:
    try:
        return Path(p).resolve().relative_to(base.resolve()).as_posix()
    except ValueError:
        return str(p)


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json_dumps_utf8(data, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def write_report_doc(data: dict, out_dir: str | os.PathLike, *, src_dir: str | os.PathLike | None = None,
                     plots: bool = True, formats: tuple[str, ...] = ("png", "svg"),
                     renderer: Renderer | None = None) -> CompareFiles:
    """:func:`write_report` from the compare.json document alone (a comparison run by another process).

    The window's comparisons run in its engine, and a :class:`CompareResult` does not cross a pipe:
    the engine sends :func:`build_report`'s document, and the window exports from it. ``src_dir`` is
    the comparison's folder; its ``runs/`` are copied when ``out_dir`` is elsewhere.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if src_dir is not None:
        src_runs = Path(src_dir) / RUNS_DIR
        if src_runs.is_dir() and out.resolve() != Path(src_dir).resolve():
            shutil.copytree(src_runs, out / RUNS_DIR, dirs_exist_ok=True)
    data = json.loads(json.dumps(data, default=str))  # a copy: the caller's document stays as it was
    data.pop("plots", None)
    jpath = out / JSON_NAME
    _write_json(jpath, data)
    files = CompareFiles(json=jpath, markdown=out / MD_NAME)
    # build_report words a comparison that measured nothing at all "nothing was measured: …".
    nothing = str(data.get("nothing_measured") or "").startswith("nothing was measured")
    if plots and not nothing:
        if renderer is None:
            files.notes = [NO_RENDERER]
        else:
            pr = renderer("compare", jpath, out / PLOTS_DIR, formats)
            files.plots = [Path(p) for p in pr.files]
            files.notes = list(pr.notes)
    data["plots"] = [_rel(p, out) for p in files.plots]
    data["notes"] = list(data.get("notes") or []) + files.notes
    _write_json(jpath, data)
    files.markdown.write_text(markdown(data), encoding="utf-8")
    return files
