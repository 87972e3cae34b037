"""Stand-ins for everything the agent talks to, and nothing the agent runs.

- `kube/`: a loopback Kubernetes API server with stand-ins of the machine-config-controller's
  render, node and drain controllers, admission (CEL) and RBAC;
- `host/`: a simulated host (files, a bootc state machine that prints the real status schema,
  systemd, reboots) and the registry its images come from;
- `demo/`: the `image-mode-agent demo` timelines, on those two;
- `bin/`: stand-in `bootc` and `ostree` executables the adapter tests run;
- `bootc_releases.py`, `capabilities.py`: what each bootc release has, for the stand-ins to
  speak one.

The agent (`agent/`) never imports this package; its `demo` and `sim` commands and
`--host simulated:DIR` load it when asked for (tests/test_layers.py holds that rule)."""
