"""The default run leaves out the conformance tier: it needs the kit and has its own command
(tests/conformance/run.sh), which sets IMAGE_MODE_AGENT_TIER=conformance."""

import os

collect_ignore = [] if os.environ.get("IMAGE_MODE_AGENT_TIER") == "conformance" else ["conformance"]
