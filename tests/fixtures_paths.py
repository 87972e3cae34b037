"""Paths of the upstream fixtures used by more than one test module."""

from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
CONTROLLER_CONFIG = (
    FIXTURES / "mco/server_testdata_controller-config_machine-config-controller.yaml"
)
