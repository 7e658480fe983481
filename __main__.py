import sys

from trajlake.cli import main

sys.exit(main())
