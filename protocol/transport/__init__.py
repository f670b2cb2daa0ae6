"""How actors reach each other and the world: broker links (in-process mailbox or
ZeroMQ), CURVE keys, listening sockets, the event loop, health probes, secret files."""
