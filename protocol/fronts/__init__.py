"""Fronts: each protocol's connections turned into schema ops for the broker, and the
broker's replies written back (beanstalk, yrmcds counters, the HTTP task API)."""
