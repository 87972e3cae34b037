"""Paths of the upstream fixtures used by more than one test module."""

from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
CONTROLLER_CONFIG = (
    FIXTURES / "mco/server_testdata_controller-config_machine-config-controller.yaml"
)
# What the real machine-config-controller rendered for a worker, and the ControllerConfig it
# rendered from (tests/fixtures/README.md: mcc-rendered/).
MCC_RENDERED_WORKER = FIXTURES / "mcc-rendered/rendered-worker.json"
MCC_CONTROLLER_CONFIG = FIXTURES / "mcc-rendered/controllerconfig.json"
