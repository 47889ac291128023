"""Finished studies: experiments with a stored result that docs/ quotes (the domain scheduler in
real training and on the simulator, the domains' headroom, one-step off-policy, long-context
learning). ``make bench`` does not re-measure them; each runs as
``python -m benchmarks.studies.<name>``. They may import the library and ``benchmarks.harness``;
the library never imports them."""
