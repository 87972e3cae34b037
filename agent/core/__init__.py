"""The pure decisions: what may be written live, what is refused, the verdict and its steps,
and what to do after a boot. No I/O."""
