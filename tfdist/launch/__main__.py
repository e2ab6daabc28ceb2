"""`python -m tfdist.launch ...`: see `tfdist.launch`."""

import sys

from tfdist.launch.cli import main

sys.exit(main())
