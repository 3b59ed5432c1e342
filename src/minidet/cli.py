"""The ``minidet`` command (placeholder while the subcommands move into the package)."""


def main(argv: list[str] | None = None) -> int:
    return 0
