import sys

from labs.serving_sim.cli import main

sys.exit(main())
