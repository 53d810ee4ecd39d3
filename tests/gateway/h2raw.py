"""h2raw — just enough raw HTTP/2 (RFC 9113) to play an abusive client against clocherd: the
connection preface, SETTINGS, HEADERS with a literal HPACK block (no Huffman, no dynamic table),
DATA and RST_STREAM. The test's python has no h2 package; these frames are simple enough to write
with struct. Nothing here parses what the server sends beyond frame boundaries.
"""
import socket
import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1
CANCEL = 0x8


def frame(ftype, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", ftype, flags, stream) + payload


def _int(value, prefix_bits, first):
    """An HPACK integer (RFC 7541 5.1) with `first`'s high bits as the pattern."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = [first | limit]
    value -= limit
    while value >= 128:
        out.append(0x80 | (value & 0x7F))
        value >>= 7
    out.append(value)
    return bytes(out)


def _literal(name_index, value, name=None):
    """A literal header field without indexing (RFC 7541 6.2.2), name by static index or new."""
    v = value.encode()
    if name is None:
        return _int(name_index, 4, 0x00) + _int(len(v), 7, 0) + v
    n = name.encode()
    return b"\x00" + _int(len(n), 7, 0) + n + _int(len(v), 7, 0) + v


def grpc_headers(path, authority="localhost", extra=()):
    block = b"\x83\x86"  # :method POST, :scheme http (static table 3 and 6)
    block += _literal(4, path) + _literal(1, authority)
    block += _literal(31, "application/grpc") + _literal(0, "trailers", name="te")
    for k, v in extra:
        block += _literal(0, v, name=k)
    return block


def grpc_message(body=b""):
    return b"\x00" + struct.pack(">I", len(body)) + body


class Conn:
    """One HTTP/2 connection (unix path or (host, port)), preface and SETTINGS sent."""

    def __init__(self, addr, timeout=5.0):
        fam = socket.AF_UNIX if isinstance(addr, str) else socket.AF_INET
        self.sock = socket.socket(fam, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(addr)
        self.sock.sendall(PREFACE + frame(SETTINGS, 0, 0) + frame(SETTINGS, ACK, 0))
        self.next_id = 1
        self.closed = False
        self.goaway = False

    def rapid_reset(self, n, path, body=b"", headers=()):
        """n streams, each HEADERS + DATA + RST_STREAM(CANCEL), in one write per 100 streams.
        Returns how many were written before the server closed the connection."""
        block = grpc_headers(path, extra=headers)
        sent = 0
        while sent < n and not self.closed:
            buf = bytearray()
            for _ in range(min(100, n - sent)):
                sid = self.next_id
                self.next_id += 2
                buf += frame(HEADERS, END_HEADERS, sid, block)
                buf += frame(DATA, END_STREAM, sid, grpc_message(body))
                buf += frame(RST_STREAM, 0, sid, struct.pack(">I", CANCEL))
            try:
                self.sock.sendall(bytes(buf))
                sent += min(100, n - sent)
            except OSError:
                self.closed = True
            self.drain()
        return sent

    def drain(self):
        """Reads what the server sent so far (without blocking); notes GOAWAY and EOF."""
        self.sock.setblocking(False)
        try:
            while True:
                b = self.sock.recv(1 << 16)
                if not b:
                    self.closed = True
                    break
                # a GOAWAY frame header: its type byte is at offset 3 of some frame; look for
                # the type anywhere a frame could start is not needed: GOAWAY precedes close
                if b.find(bytes([GOAWAY, 0, 0, 0, 0, 0])) >= 0:
                    self.goaway = True
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self.closed = True
        finally:
            if not self.closed:
                self.sock.settimeout(5.0)

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass
