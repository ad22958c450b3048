"""remote_http.py — the HTTP side of RemoteClient: connections to
``cerberus serve`` over a unix socket or loopback TCP, one request per
connection, and the daemon's answers turned into the package's exceptions.

A request connects (bounded by the client's timeout: Unavailable naming
the address when nobody answers, with ``gone`` set when nothing listens
there at all), sends ``Connection: close`` and reads the whole answer
(bounded by the read timeout it is given). Its connection is attached to a
:class:`RemoteCancel` while in flight, so another thread can end it by
shutting the socket down. An error answer ``{"status": NAME, "error":
TEXT}`` becomes the exception class of that status (errors.error_for); its
HTTP code stands in when the body does not say; 401 is Unauthorized. The
bearer token goes in the Authorization header and nowhere else.
"""

from __future__ import annotations

import errno
import http.client
import json
import socket
import threading
from typing import Any, Dict, Optional, Tuple, Union
from urllib.parse import quote, urlsplit

from .errors import (Error, Interrupted, InvalidArgument, IOFailure, ProtocolError, Status,
                     Unauthorized, Unavailable, error_for)

# HTTP codes of error answers whose body did not say the status.
_BY_HTTP = {409: Status.BUSY, 408: Status.TIMEOUT, 503: Status.UNAVAILABLE,
            400: Status.EINVAL, 404: Status.NOT_OWNER, 410: Status.LOST}


def _q(part: Union[str, bytes]) -> str:
    """One path segment, percent-encoded (a / in a name stays in it)."""
    return quote(part, safe="")


def _check_name(name: object, what: str) -> str:
    if not isinstance(name, str):
        raise TypeError("%s is a str, not %s" % (what, type(name).__name__))
    if "\0" in name:
        raise InvalidArgument(Status.EINVAL, "%s contains a NUL character at offset %d"
                              % (what, name.index("\0")))
    return name


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over a unix socket: http.client with its connect replaced."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(self.timeout)
            s.connect(self._path)
        except BaseException:
            s.close()
            raise
        self.sock = s


def _shutdown(conn: Optional[http.client.HTTPConnection]) -> None:
    """Wake a thread blocked on @conn's socket (from any thread)."""
    # The socket as connected (Transport.connect): http.client drops
    # conn.sock once the answer to a "Connection: close" request has begun
    # (the response reads on from it), and a shutdown through conn.sock
    # would then do nothing: an event stream would stay open.
    sock = getattr(conn, "_cerb_sock", None) or getattr(conn, "sock", None) \
        if conn is not None else None
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class RemoteCancel:
    """Ends one request of a :class:`RemoteClient` in flight (the remote
    counterpart of :class:`~cerberus.Cancel`, which needs the library).

    :meth:`fire` it from any thread: the request's connection is shut down
    and the call raises :class:`~cerberus.Interrupted`. Unlike a library
    cancel, the daemon cannot give back a grant that landed as the
    connection closed: such a hold is released by the daemon when its
    lease passes (nobody keeps it alive), so give acquisitions that may be
    cancelled a short ``lease_ms``. Firing is final.
    """

    def __init__(self) -> None:
        self._mu = threading.Lock()
        self._fired = False
        self._conn: Optional[http.client.HTTPConnection] = None
        self._error = ""

    def fire(self) -> None:
        """End the request using this cancel (never waits)."""
        with self._mu:
            self._fired = True
            conn = self._conn
        _shutdown(conn)

    @property
    def fired(self) -> bool:
        """Whether :meth:`fire` was called."""
        return self._fired

    @property
    def error(self) -> str:
        """The error text of the last call this cancel was passed to."""
        return self._error

    def close(self) -> None:
        """Nothing to free (for the interface of Cancel)."""

    def __enter__(self) -> "RemoteCancel":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _attach(self, conn: http.client.HTTPConnection) -> bool:
        with self._mu:
            if self._fired:
                return False
            self._conn = conn
            return True

    def _detach(self) -> None:
        with self._mu:
            self._conn = None


class _Transport:
    """The daemon's address, the token and the bounds: makes connections
    and requests, and turns failures and error answers into exceptions."""

    def __init__(self, address: str, token: Optional[str], timeout: float) -> None:
        self.address = address
        self.timeout = timeout
        self.unix: Optional[str] = None
        self.host = ""
        self.port = 0
        if address.startswith("unix:"):
            path = address[len("unix:"):]
            if path.startswith("//"):  # unix:///run/x.sock
                path = path[2:]
            if not path:
                raise ValueError("a unix: address needs a socket path: unix:/run/cerberus/"
                                 "cerberus.sock")
            self.unix = path
        elif address.startswith("http://"):
            u = urlsplit(address)
            try:
                port = u.port
            except ValueError as e:
                raise ValueError("bad port in %r: %s" % (address, e)) from None
            if not u.hostname or not port or u.path not in ("", "/") or u.query:
                raise ValueError("a TCP address is http://HOST:PORT (such as "
                                 "http://127.0.0.1:8080), not %r" % address)
            self.host, self.port = u.hostname, port
        else:
            raise ValueError("the address of cerberus serve is unix:PATH or http://HOST:PORT, "
                             "not %r" % address)
        self._auth = "Bearer " + token if token else None

    def connect(self, what: str, timeout: Optional[float] = None) -> http.client.HTTPConnection:
        """A connected connection; Unavailable naming the address (its
        ``gone`` attribute true when nothing listens there) when not."""
        t = self.timeout if timeout is None else timeout
        conn: http.client.HTTPConnection
        if self.unix is not None:
            conn = _UnixConnection(self.unix, t)
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=t)
        try:
            conn.connect()
            setattr(conn, "_cerb_sock", conn.sock)  # for _shutdown
        except OSError as e:
            conn.close()
            reason = e.strerror or str(e) or type(e).__name__
            if isinstance(e, socket.timeout):
                reason = "no connection within %g s" % t
            err = Unavailable(Status.UNAVAILABLE, "cannot reach the cerberus daemon at %s: %s"
                              % (self.address, reason), what)
            err.gone = e.errno in (errno.ENOENT, errno.ECONNREFUSED)  # type: ignore[attr-defined]
            raise err from None
        return conn

    def headers(self, body: bool, accept: str = "application/json") -> Dict[str, str]:
        h = {"Accept": accept, "Connection": "close"}
        if body:
            h["Content-Type"] = "application/json"
        if self._auth:
            h["Authorization"] = self._auth
        return h

    def request(self, method: str, path: str, body: Optional[dict], what: str,
                read_timeout: float, cancel: RemoteCancel,
                connect_timeout: Optional[float] = None) -> Tuple[str, bytes]:
        """One request: (content type, body) of a 200 answer; raises the
        answer's error, Unavailable (no daemon), IOFailure (no answer) or
        Interrupted (@cancel fired). @connect_timeout bounds the connect
        (the client's timeout when None): a keepalive must not outlast its
        hold's deadline."""
        if cancel.fired:
            raise Interrupted(Status.INTERRUPTED, "the cancel was fired", what)
        conn = self.connect(what, connect_timeout)
        try:
            if not cancel._attach(conn):
                raise Interrupted(Status.INTERRUPTED, "the cancel was fired", what)
            try:
                assert conn.sock is not None
                conn.sock.settimeout(read_timeout)
                payload = None if body is None else json.dumps(body).encode("utf-8")
                conn.request(method, path, body=payload, headers=self.headers(payload is not None))
                resp = conn.getresponse()
                data = resp.read()
            except (OSError, http.client.HTTPException) as e:
                if cancel.fired:
                    cancel._error = ("cancelled: the connection was closed; a grant that lands "
                                     "anyway is released by the daemon when its lease passes")
                    raise Interrupted(Status.INTERRUPTED, cancel._error, what) from None
                if isinstance(e, socket.timeout):
                    text = ("the cerberus daemon at %s did not answer within %g s"
                            % (self.address, read_timeout))
                else:
                    text = ("the connection to the cerberus daemon at %s failed: %s"
                            % (self.address, str(e) or type(e).__name__))
                raise IOFailure(Status.EIO, text, what) from None
            finally:
                cancel._detach()
        finally:
            conn.close()
        ctype = resp.getheader("Content-Type", "") or ""
        if resp.status == 200:
            cancel._error = ""
            return ctype, data
        err = self.error(resp.status, data, what)
        cancel._error = err.text
        raise err

    def error(self, code: int, data: bytes, what: str) -> Error:
        """The exception for an error answer."""
        body: Any = None
        try:
            body = json.loads(data.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            pass
        if not isinstance(body, dict):
            body = {}
        name = body.get("status")
        text = body.get("error") if isinstance(body.get("error"), str) else ""
        if code == 401 or name == "UNAUTHORIZED":
            return Unauthorized(Status.EINVAL, text or "the daemon at %s wants another token"
                                % self.address, what)
        if isinstance(name, str) and name in Status.__members__ and name != "OK":
            st = Status[name]
        else:
            st = _BY_HTTP.get(code, Status.EPROTO)
            if not body:
                text = ("HTTP %d from the cerberus daemon at %s: %r"
                        % (code, self.address, data[:200]))
        if code == 404 and text == "no such route":
            text = ("the cerberus daemon at %s has no such route: it is older than this "
                    "client, or the request is not one it serves" % self.address)
        return error_for(st, text, what)


def _json(ctype: str, data: bytes, what: str) -> Dict[str, Any]:
    try:
        v = json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        v = None
    if not isinstance(v, dict):
        raise ProtocolError(Status.EPROTO, "the daemon answered %r (%s), not a JSON object"
                            % (data[:200], ctype or "no content type"), what)
    return v
