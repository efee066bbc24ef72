"""`kubegpu gpu-guard`: a node agent that keeps each pod on a shared GPU within its memory share."""
