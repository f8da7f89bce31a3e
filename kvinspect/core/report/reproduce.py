"""How to reproduce a recorded session: the chat script and the command line.

What reproduces a trace depends on where it came from (:func:`trace_origin`):

- ``run``: ``kvinspect run`` recorded its argv in ``header["command"]``; it is reused with its
  file arguments pointed at the bundle's ``script.json`` (rebuilt from the trace's turns and the
  header's session settings), chat template and a ``rerun`` folder.
- ``rebuilt``: a GUI session has no command; a ``kvinspect run`` line is rebuilt from
  ``header["session"]`` and the model spec.
- ``trace``: ``kvinspect trace -- python prog.py`` observed the user's own program. Its turns are
  the program's ``generate()``/forward calls, labelled by call site: there is no user text to put
  in a script, so none is made; the command reruns the program under ``kvinspect trace``.
- ``observe``: ``kvinspect.observe()`` inside the program wrote the trace; no command exists,
  so the program's own command line (as recorded) is what reruns it.

What a command line cannot carry (a per-turn policy change in the GUI, a turn stopped by hand)
is listed as caveats.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from kvinspect.core.model.catalog import find_builtin
from kvinspect.core.report.md_snippets import count_noun, turn_phrase
from kvinspect.core.session.script import ChatScript, GenerationSettings
from kvinspect.core.text_safety import md_code
from kvinspect.core.trace.record import TraceRecord

SCRIPT_NAME = "script.json"
RERUN_DIR = "rerun"
TEMPLATE_FALLBACK = "chat-template.jinja"
#: ``kvinspect run`` options whose value is a file or folder that the bundle replaces.
_FILE_OPTIONS = ("--script", "--out", "--chat-template")
#: Where a trace came from (see the module docstring); it decides the command and the report's words.
RUN, REBUILT, TRACE, OBSERVE = "run", "rebuilt", "trace", "observe"


@dataclass
class Reproduction:
    """What it takes to rerun a trace: a script, maybe a template, a command, and caveats."""

    command: list[str]
    script: ChatScript | None
    template_name: str | None = None
    template_text: str | None = None
    caveats: list[str] = field(default_factory=list)
    from_header: bool = False  # the command was recorded by kvinspect itself (run or trace)
    origin: str = RUN  # RUN, REBUILT, TRACE or OBSERVE
    #: The folder the command must run in: None for the bundle's own folder; for an observed program,
    #: the folder it ran in (its arguments may be relative to it).
    run_in: str | None = None


def trace_origin(header: dict) -> str:
    """RUN, REBUILT (a GUI session), TRACE (``kvinspect trace``) or OBSERVE (``kvinspect.observe()``)."""
    cmd = list(header.get("command") or [])
    mode = (header.get("observed") or {}).get("mode")
    if mode == "trace" or cmd[1:2] == ["trace"]:
        return TRACE
    if mode is not None or (header.get("model") or {}).get("source") == "observed":
        return OBSERVE
    return RUN if cmd else REBUILT


def rebuild_script(record: TraceRecord) -> tuple[ChatScript | None, list[str]]:
    """The conversation as a chat script, plus caveats. None when no turn has text to replay."""
    sess = record.header.get("session") or {}
    caveats: list[str] = []
    turns = [t for t in record.turns if t.user and t.user.strip()]
    if len(turns) < len(record.turns):
        lost = len(record.turns) - len(turns)
        caveats.append(f"{count_noun(lost, 'turn')} lost {'its' if lost == 1 else 'their'} text in a damaged trace "
                       f"and {'is' if lost == 1 else 'are'} left out")
    if not turns:
        return None, caveats
    raw = dict(turns[0].settings or sess.get("settings") or {})
    known = set(GenerationSettings.__dataclass_fields__)
    settings = GenerationSettings(**{k: v for k, v in raw.items() if k in known})
    def same(s: dict) -> dict:  # a turn's pictures are its own, not a setting
        return {k: v for k, v in s.items() if k != "images"}

    differ = [t.index + 1 for t in turns[1:] if t.settings and same(t.settings) != same(turns[0].settings)]
    if differ:
        caveats.append(f"{turn_phrase(differ)} ran with other generation settings than turn 1; "
                       f"a script has one set, so {_it(differ)} {_verb(differ, 'replays', 'replay')} with "
                       f"turn 1's")
    stopped = [t.index + 1 for t in turns if t.status == "stopped"]
    if stopped:
        caveats.append(f"{turn_phrase(stopped)} {_verb(stopped, 'was', 'were')} stopped by hand; the rerun "
                       f"generates {_it(stopped)} in full, so later prompts (and lengths) differ from this trace")
    cut = [t.index + 1 for t in turns if t.status in ("interrupted", "incomplete")]
    if cut:
        caveats.append(f"{turn_phrase(cut)} did not finish in this trace; the rerun completes {_it(cut)}")
    if settings.do_sample:
        caveats.append("sampling is on: the rerun matches only with the same seed, device and library versions")
    images = [[str(p) for p in (t.settings or {}).get("images") or []] for t in turns]
    if any(images):
        caveats.append("the script names each turn's pictures by their paths on the machine that ran it: copy them "
                       "there, or edit the paths")
    return ChatScript(turns=[t.user for t in turns], system=sess.get("system"), settings=settings,
                      images=images if any(images) else []), caveats


def reproduce(record: TraceRecord) -> Reproduction:
    """The command (and script) that reproduce ``record``; see the module docstring for each origin."""
    origin = trace_origin(record.header)
    if origin in (TRACE, OBSERVE):
        return _reproduce_program(record, origin)
    h = record.header
    sess = h.get("session") or {}
    model = h.get("model") or {}
    script, caveats = rebuild_script(record)
    tpl_text = sess.get("chat_template_text")
    tpl_path = sess.get("chat_template")
    tpl_name = None
    if tpl_text:
        tpl_name = _template_file_name(tpl_path)
    elif tpl_path:
        caveats.append(f"the chat template {md_code(tpl_path)} is not stored in this trace (older writer): the command "
                       f"needs that file at that path")
    header_cmd = h.get("command")
    if header_cmd and not (len(header_cmd) > 1 and header_cmd[1] == "run"
                           and Path(str(header_cmd[0])).name in ("kvinspect", "kvinspect.exe", "__main__.py")):
        # The trace is the sender's: a "command" that is not kvinspect's own is never offered as the way to rerun.
        caveats.append("the trace's recorded command is not a `kvinspect run` command line, so it is not shown; "
                       "this one is rebuilt from the session settings")
        header_cmd = None
    if header_cmd:
        cmd = _retarget(list(header_cmd), tpl_name)
    else:
        cmd = _rebuild_command(h, tpl_name or tpl_path)
    policies = sorted({t.policy for t in record.turns if t.policy})
    if len(policies) > 1:
        caveats.append(f"turns used different policies ({', '.join(map(md_code, policies))}); `kvinspect run` "
                       f"applies one policy ({md_code(sess.get('policy'))}) to every turn")
    impls = sorted({t.cache_impl for t in record.turns if t.cache_impl})
    if len(impls) > 1:
        caveats.append(f"turns used different cache implementations ({', '.join(map(md_code, impls))}); the "
                       f"command uses {md_code(sess.get('cache_impl'))} for every turn")
    spec = str(model.get("spec") or "")
    builtin = find_builtin(spec) if spec else None
    if builtin is not None and builtin.fetch:
        caveats.append(f"{builtin.name} is fetched once with `kvinspect models fetch {builtin.fetch}`")
    elif builtin is None and model.get("source") in ("gguf", "dir"):
        caveats.append(f"the model is a local path ({md_code(spec)}): put the same files at that path, or change --model")
    elif builtin is None and model.get("source") == "hub":
        caveats.append(f"the model is the hub id {md_code(spec)}: the first run downloads it (or set HF_HUB_OFFLINE=1 "
                       f"with it cached)")
    return Reproduction(command=cmd, script=script, template_name=tpl_name, template_text=tpl_text,
                        caveats=caveats, from_header=bool(header_cmd), origin=origin if header_cmd else REBUILT)


def _reproduce_program(record: TraceRecord, origin: str) -> Reproduction:
    """An observed program: rerun the program itself. No script: its "turns" are call-site labels
    such as ``generate() at prog.py:43``, not user text, and the program decides the conversation."""
    h = record.header
    obs = h.get("observed") or {}
    if origin == TRACE:
        cmd = _trace_rerun(list(h.get("command") or []), [str(a) for a in obs.get("argv") or []])
    else:  # kvinspect.observe() inside the program: the program's own command line reruns it
        cmd = [str(a) for a in obs.get("argv") or []]
    caveats = []
    if any((t.settings or {}).get("do_sample") for t in record.turns):
        caveats.append("the program sampled: the rerun matches only with the same seed, device and library "
                       "versions")
    caveats.append("the program decides the prompts and settings, so the rerun shows the same lengths only "
                   "when it gets the same inputs (files, arguments, model) as when it was recorded")
    return Reproduction(command=cmd, script=None, caveats=caveats, from_header=origin == TRACE, origin=origin,
                        run_in=obs.get("cwd") or None)


def _trace_rerun(cmd: list[str], argv: list[str]) -> list[str]:
    """``kvinspect trace [opts] -- PROGRAM`` with ``--out rerun``: the traces go to a fresh folder."""
    sep = cmd.index("--") if "--" in cmd else len(cmd)
    opts, program = cmd[1:sep], cmd[sep + 1:] or argv
    kept: list[str] = []
    i = 1  # opts[0] is "trace"
    while i < len(opts):
        opt = opts[i].split("=", 1)[0]
        if opt == "--out":
            i += 1 if "=" in opts[i] else 2
            continue
        kept.append(opts[i])
        i += 1
    return ["kvinspect", "trace", "--out", RERUN_DIR, *kept, "--", *program]


def _template_file_name(path: str | None) -> str:
    name = Path(str(path)).name if path else ""
    # The name comes from the trace: only a plain file name is used for a file in the bundle (no control,
    # bidi or shell character, nothing a shell or a terminal would read as more than a name).
    if _PLAIN_NAME.fullmatch(name) and name not in (SCRIPT_NAME,) and name[0] not in ".-":
        return name
    return TEMPLATE_FALLBACK


_PLAIN_NAME = re.compile(r"[A-Za-z0-9._+-]{1,200}\.jinja")


def _retarget(cmd: list[str], tpl_name: str | None) -> list[str]:
    """Point the file arguments of a recorded command at the bundle's files."""
    want = {"--script": SCRIPT_NAME, "--out": RERUN_DIR, "--chat-template": tpl_name}
    out: list[str] = []
    i = 0
    while i < len(cmd):
        a = cmd[i]
        opt = a.split("=", 1)[0]
        target = want.get(opt) if opt in _FILE_OPTIONS else None
        if target is not None:
            out += [opt, target]
            i += 1 if "=" in a else 2
            continue
        out.append(a)
        i += 1
    if out and out[0] != "kvinspect":
        out[0] = "kvinspect"
    return out


def _rebuild_command(h: dict, template: str | None) -> list[str]:
    """A ``kvinspect run`` line from a header that has no recorded command (a GUI session)."""
    sess = h.get("session") or {}
    model = h.get("model") or {}
    cmd = ["kvinspect", "run", "--model", str(model.get("spec") or model.get("name") or "MODEL"),
           "--script", SCRIPT_NAME, "--out", RERUN_DIR]
    device = model.get("device") or h.get("device")
    if device and device != "auto":
        cmd += ["--device", str(device)]
    if model.get("dtype"):
        cmd += ["--dtype", str(model["dtype"]).removeprefix("torch.")]
    if sess.get("policy") and sess["policy"] != "reuse":
        cmd += ["--policy", sess["policy"]]
    if sess.get("cache_impl") and sess["cache_impl"] != "dynamic":
        cmd += ["--cache", sess["cache_impl"]]
    if template:
        cmd += ["--chat-template", template]
    if sess.get("max_cache_len"):
        cmd += ["--max-cache-len", str(sess["max_cache_len"])]
    for k, v in (sess.get("generation_config_overrides") or {}).items():
        cmd += ["--generation-config", f"{k}={json.dumps(v) if not isinstance(v, str) else v}"]
    if sess.get("respect_generation_config"):
        cmd.append("--respect-generation-config")
    return cmd


def _it(turns: list[int]) -> str:
    return "it" if len(set(turns)) == 1 else "them"


def _verb(turns: list[int], one: str, many: str) -> str:
    return one if len(set(turns)) == 1 else many
