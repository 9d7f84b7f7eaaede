"""`python -m sftq_server.simulator`: run the simulator until SIGTERM or SIGINT."""

from __future__ import annotations

import sys

from sftq_server.simulator.server import main

sys.exit(main())
