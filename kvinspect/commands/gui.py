"""``kvinspect gui`` (and bare ``kvinspect``): the inspector window. Qt is imported only here."""

from __future__ import annotations

from .common import add_model_args, add_session_args


def add_parser(sub) -> None:
    p = sub.add_parser("gui", help="open the inspector window (optionally scripted, for screenshots)")
    add_model_args(p, required=False)
    p.add_argument("--script", default=None, metavar="FILE", help="run this chat script in the window")
    p.add_argument("--screenshot", default=None, metavar="PNG", help="save a window screenshot when the script is done")
    p.add_argument("--exit-when-done", action="store_true", help="quit after the script (and the screenshot)")
    p.add_argument("--ssh", default=None, metavar="HOST", help="run the model on HOST: `ssh HOST PYTHON -m kvinspect "
                   "engine` with your ssh config and keys (KVINSPECT_SSH_COMMAND changes the ssh command)")
    p.add_argument("--ssh-python", default=None, metavar="PYTHON",
                   help="with --ssh: the host's python that has kvinspect (default python3)")
    add_session_args(p)


def main(args, argv) -> int:
    from ..gui.app import run_from_args

    if args.ssh is not None:  # before the window opens: one line, exit 2
        from ..engine.launch import check_ssh_host

        args.ssh = check_ssh_host(args.ssh)
    return run_from_args(args, argv)
