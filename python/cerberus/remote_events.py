"""remote_events.py — the listener thread of a RemoteHold: it keeps the
hold's event stream (``GET /v1/holds/{id}/events``) open for as long as
the hold is held.

Why a stream besides the keepalives (remote_hold.py): the daemon never
expires a hold that somebody listens to, and a hold acquired without
``lease_ms`` lives on the daemon by its ``serve.keepalive_ms``, which the
client is not told (it may be shorter than any keepalive period the client
would pick). The open stream keeps such a hold whatever that window is.
It also brings bad news early: ``event: lost`` (the daemon's library lost
the hold) and ``event: released`` (the daemon released it, as it does when
it stops) make the hold LOST at once, as does a 404 or 410 answer or a
daemon that is no longer there (its socket refuses or is gone).

The stream never makes a hold valid: its heartbeats come at times the
client did not choose, so no deadline can be counted from them; validity
is the keepalives' alone. A stream that ends or breaks is reopened after a
pause growing from 50 ms to 1 s; while it is down the keeper sends its
keepalives more often when the daemon's window is not known (see
_HoldCore.period), so the window that restarts when the stream closes is
kept by them.
"""

from __future__ import annotations

import http.client
from typing import TYPE_CHECKING

from .errors import Unavailable
from .remote_http import _q

if TYPE_CHECKING:
    from .remote_hold import _HoldCore

# An event stream says `event: heartbeat` every 5 s: one silent for this
# long is taken for dead and reopened (it decides no state).
_STREAM_SILENCE_S = 15.0


def listen(core: "_HoldCore") -> None:
    """The listener thread's body: returns once the hold is done or lost.

    Thread-safety: runs on its own thread; it shares only what _HoldCore
    guards with its mutex (the open connection, the ``listening`` flag).
    """
    t = core.client._t
    path = "/v1/holds/%s/events" % _q(core.id)
    what = 'listen to the hold of "%s"' % core.name
    pause = 0.05
    while True:
        core.resume.wait()
        if core.done:
            return
        try:
            conn = t.connect(what, _STREAM_SILENCE_S)
        except Unavailable as e:
            if getattr(e, "gone", False):
                core._lose("%s; nobody keeps the hold any more" % e.text, True)
                return
        else:
            try:
                with core.mu:
                    if core.done:
                        conn.close()
                        return
                    if not core.resume.is_set():  # paused meanwhile (a test)
                        conn.close()
                        continue
                    core.stream = conn
                conn.request("GET", path, headers=t.headers(False, "text/event-stream"))
                resp = conn.getresponse()
                if resp.status in (404, 410):
                    err = t.error(resp.status, resp.read(), what)
                    core._lose("the daemon no longer keeps the hold (%s: %s): it expired or "
                               "was released" % (err.name, err.text), True)
                    return
                if resp.status == 200:
                    core.listening = True
                    while True:
                        line = resp.readline()
                        if not line:
                            break  # the stream ended: reopen it, or learn why not
                        line = line.strip()
                        if line.startswith(b"event:"):
                            pause = 0.05
                        if line == b"event: lost":
                            core._lose("the daemon reports the hold lost (its lease or session "
                                       "ended while held)", False)
                            return
                        if line == b"event: released":
                            core._lose("the daemon released the hold (it is stopping, or the "
                                       "hold was released by another request)", True)
                            return
                else:
                    resp.read()
            except (OSError, http.client.HTTPException):
                pass  # the stream broke: reopen it
            finally:
                with core.mu:
                    core.stream = None
                    core.listening = False
                conn.close()
                core.wake.set()  # the keeper's period shortens while no stream is open
        if core.done:
            return
        core.stopping.wait(pause)
        pause = min(pause * 2, 1.0)
