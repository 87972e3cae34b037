"""Reboot strategies of a host that follows an image (`run --source image:REF`): when a staged
update may be finalized (the reboot), and how a host says it is steady again. One module per
strategy, as Zincati's `src/strategy/`: `immediate`, `periodic` (weekly maintenance windows),
`fleet_lock` (a FleetLock server's counting semaphore)."""
