"""One module per ``kvinspect`` subcommand: ``add_parser(sub)`` and ``main(args, argv)``."""
