"""zstalk protocols, in layers, each importing only those below it: the vocabulary every
actor speaks (schema/), sans-IO codecs (codecs/), the network (network/: listening
sockets, the loop, probes, CURVE, secret files), the links to the broker (links/), and
the fronts that speak each protocol to clients (fronts/).  ratelog.py, a log line at most
once per key per interval, sits at the bottom beside the vocabulary."""
