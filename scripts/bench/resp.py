#!/usr/bin/env python3
"""A minimal Redis client for the benchmark scripts (RESP2 over one loopback socket): enough to
send commands and read their replies, with no package to install.
"""
import socket


class Redis:
    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.file = self.sock.makefile("rb")
    def __call__(self, *args):
        out = b"*%d\r\n" % len(args)
        for a in args:
            a = str(a).encode()
            out += b"$%d\r\n%s\r\n" % (len(a), a)
        self.sock.sendall(out)
        return self.read()
    def read(self):
        line = self.file.readline()
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.file.read(n + 2)[:-2]
            return data.decode()
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise RuntimeError(f"unexpected reply {line!r}")
    def log_every_call(self):
        """SLOWLOG keeps every command, with room for all of them (Redis 7.0 also logs each
        command a script runs)."""
        self("CONFIG", "SET", "slowlog-log-slower-than", "0")
        self("CONFIG", "SET", "slowlog-max-len", "1000000")
