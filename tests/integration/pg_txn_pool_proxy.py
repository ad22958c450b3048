#!/usr/bin/env python3
"""pg_txn_pool_proxy.py — a tiny transaction-pooling proxy for the tests.

    pg_txn_pool_proxy.py LISTEN_PORT SERVER_PORT

What PgBouncer's pool_mode = transaction does to a client, reduced to what
a test needs: every client connection is served by two server sessions,
and each transaction (a simple Query, or extended-protocol messages up to
their Sync) goes to one of them in turn, as long as the server says the
session is idle between transactions (ReadyForQuery 'I'). The startup
message is replayed to both sessions (trust authentication only), and the
client sees the first one's answers. SSL and GSS requests are refused
('N'), as a plain proxy would. Nothing is parsed beyond message framing.

It listens on 127.0.0.1:LISTEN_PORT, prints "ready" once listening, and
runs until killed (one thread per client).
"""
import socket
import struct
import sys
import threading

SSL_REQUEST, GSS_REQUEST = 80877103, 80877104


def read_exact(sock, n):
    buf = b""
    while len(buf) < n:
        part = sock.recv(n - len(buf))
        if not part:
            raise EOFError
        buf += part
    return buf


def read_msg(sock):
    head = read_exact(sock, 5)
    kind, length = head[:1], struct.unpack("!i", head[1:])[0]
    return kind, head + read_exact(sock, length - 4)


def serve(client, server_port):
    servers = []
    try:
        while True:
            head = read_exact(client, 8)
            length, code = struct.unpack("!ii", head)
            if code in (SSL_REQUEST, GSS_REQUEST):
                client.sendall(b"N")
                continue
            startup = head + read_exact(client, length - 8)
            break
        for i in range(2):
            s = socket.create_connection(("127.0.0.1", server_port))
            s.sendall(startup)
            while True:
                kind, msg = read_msg(s)
                if i == 0:
                    client.sendall(msg)
                if kind == b"E" and i == 0:
                    return
                if kind == b"Z":
                    break
            servers.append(s)
        cur = 0
        while True:
            batch = []
            while True:
                kind, msg = read_msg(client)
                if kind == b"X":
                    return
                batch.append(msg)
                if kind in (b"S", b"Q"):
                    break
            server = servers[cur]
            server.sendall(b"".join(batch))
            while True:
                kind, msg = read_msg(server)
                client.sendall(msg)
                if kind == b"Z":
                    idle = msg[5:6] == b"I"
                    break
            if idle:
                cur ^= 1
    except (EOFError, OSError):
        pass
    finally:
        for s in servers + [client]:
            try:
                s.close()
            except OSError:
                pass


def main():
    listen_port, server_port = int(sys.argv[1]), int(sys.argv[2])
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("127.0.0.1", listen_port))
    lsock.listen(64)
    print("ready", flush=True)
    while True:
        client, _ = lsock.accept()
        threading.Thread(target=serve, args=(client, server_port), daemon=True).start()


if __name__ == "__main__":
    main()
