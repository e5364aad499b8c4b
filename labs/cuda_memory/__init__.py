"""Memory lab: coalesced, strided and scattered reads; a transpose through shared memory; bank conflicts."""
