"""What each `zoo` command that runs an export does, as one library function that returns the
lines it prints: cli.py parses the options, calls the function, prints its lines and maps errors
to exit codes. Progress goes to the `progress` callback each takes (the command line's stderr).

These bodies need no torch (tests/house/test_structure.py holds their module-level imports to the
runtime's libraries); the commands that drive PyTorch live with what they drive:
export/commands.py (export, parity, triton), zoo/commands.py (build, import, train),
export/bench/run.py (bench), export/inspect/attention.py (attention)."""
