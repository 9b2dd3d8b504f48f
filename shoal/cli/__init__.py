"""The `shoal` command: one module per subcommand; `main` is the only place that turns
errors into exit codes (see `exit_codes`)."""
