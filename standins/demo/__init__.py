"""`image-mode-agent demo`: a loopback API server (`fakekube`) and a simulated host with the
real agent process between them. The tests build on the same pieces."""
