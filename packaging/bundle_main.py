"""The frozen app's entry point: the window, or ``APP engine`` (the window's own model process).

The bundle is one executable for both roles, so :func:`kvinspect.engine.launch.engine_command`
starts the engine as ``[sys.executable, "engine"]`` and :func:`kvinspect.cli.gui_main` routes it.
Any other subcommand works too (``APP run ...``): the CLI's own dispatch decides.
"""

import sys

from kvinspect.cli import COMMANDS, gui_main, main

if __name__ == "__main__":
    first = sys.argv[1] if len(sys.argv) > 1 else ""
    sys.exit(main(sys.argv[1:]) if first in COMMANDS or first in ("--version", "-h", "--help") else gui_main())
