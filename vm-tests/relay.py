"""One guest TCP connection to the loopback registry: qemu's slirp `guestfwd=...-cmd:` runs this
per connection with the connection on stdin/stdout (a `tcp:` chardev target would carry only a
single connection, and skopeo opens several)."""

import os
import selectors
import socket
import sys

sock = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
sock.settimeout(None)
sel = selectors.DefaultSelector()
sel.register(0, selectors.EVENT_READ)
sel.register(sock, selectors.EVENT_READ)
while True:
    for key, _ in sel.select():
        if key.fileobj == 0:
            data = os.read(0, 65536)
            if not data:
                sock.shutdown(socket.SHUT_WR)
                sel.unregister(0)
                continue
            sock.sendall(data)
        else:
            data = sock.recv(65536)
            if not data:
                sys.exit(0)
            os.write(1, data)
