"""The ``jetserve`` command: ``up`` runs the whole stack locally (more subcommands follow)."""
