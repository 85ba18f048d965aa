"""`python -m hybridserving_engine.simulator <SGLang launch_server flags>`: run one SGLang simulator."""

import sys

from hybridserving_engine.simulator.server import main

sys.exit(main())
