import sys

from largeprompt.bench import main

sys.exit(main())
