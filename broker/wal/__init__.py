"""Durability: the binlog, its on-disk format, fsync, and beanstalkd's binlog read and
imported."""
