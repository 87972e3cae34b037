"""image-mode-agent: the node-side agent of image-mode OpenShift."""

__version__ = "0.1.0"
