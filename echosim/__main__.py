"""`python -m echosim` runs the CLI, for environments where the console script is not on PATH."""

from echosim.cli import main

main()
