"""`python -m kubegpu` is the `kubegpu` command, for machines where the console script is not on PATH."""

from kubegpu.cli import main

main()
