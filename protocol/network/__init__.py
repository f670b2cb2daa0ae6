"""How a zstalk process meets the network, whatever it runs: listening sockets (listen.py),
the event loop (loop.py), health probes and /metrics (health.py), CurveZMQ keys and the
broker's admitted keys (curve.py), secret files (secret.py) and the pass key file
(pass_keys.py).  It knows the vocabulary and the codecs, nothing of links or fronts."""
