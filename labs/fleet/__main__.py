import sys

from labs.fleet.cli import main

sys.exit(main())
