"""Standalone mode (`run --source image:REF`): a bootc host with no cluster follows an image
tag, and reboots into each new digest when its strategy (agent/strategy/) allows."""
