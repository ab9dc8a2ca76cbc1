"""What each `zoo` command does, as one library function that returns the lines it prints:
cli.py parses the options, calls the function, prints its lines and maps errors to exit codes.
Progress goes to the `progress` callback each takes (the command line's stderr)."""

from pathlib import Path


def wrote(folder: Path) -> str:
    """The line every command that made a folder ends with: the folder and its files."""
    return f"wrote {folder}/ ({', '.join(sorted(p.name for p in folder.iterdir()))})"
