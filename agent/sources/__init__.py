"""Where the desired state comes from."""
