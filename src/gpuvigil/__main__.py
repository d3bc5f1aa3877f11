"""`python -m gpuvigil` runs the command line."""

from gpuvigil.cli import main

main()
