"""`python -m pdserve ...` runs the same command line as the `pdserve` script."""
import sys

from pdserve.cli import main

sys.exit(main())
