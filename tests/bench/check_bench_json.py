#!/usr/bin/python3
"""check_bench_json.py — the schema of cerberus-bench's --json output (an
array of row objects, bench/report.c), for the bench tests.

usage: check_bench_json.py FILE [--engine E] [--peer-rows none|some|any]
                           [--peer-status measured|skipped|failed ...]

Every object: scenario and engine (non-empty strings), threads (positive
integer), "peer" (null on Cerberus's rows, the peer's name on a peer's).
Cerberus's rows (other than failover findings, which carry "note"):
ops_per_s, p50_us, p99_us, max_us numbers >= 0 and ops_per_s > 0; ratio a
number or null; wakeups_per_acq, calls_per_acq, cpu_percent and
bytes_per_lock present, numbers or null.
Guard rows (scenario guard or guard-dup): ceiling_missing null and ratio a
positive number (with ceiling_ops_per_s), or ceiling_missing a non-empty
string ("no ceiling for engine X (why)") and ratio null;
server_cmds_per_op and ceiling_server_cmds_per_op positive numbers or
null, both or neither, and numbers only with a ceiling (the ceiling's
session counts the server's commands).
Switch rows: ceiling_kind "alone"; alone_ops_per_s equal to
ceiling_ops_per_s and, like ratio, a positive number; engines a list of two
or more names with the row's engine among them; from one of them;
epoch_before, epoch_after, lease_ms, hold_ms, settle_ms, busy, busy_alone
integers; target_min 0.9 and target_met a boolean.
Semaphore rows: permits a positive integer, threads = 2 x permits.
Rwlock rows: reads and writes integers (writes > 0 once reads > 20),
read_p50_us and write_p50_us numbers.
Elect-failover rows (other than the local engine's note): ceiling_kind
"bound"; candidates = threads >= 2; rounds >= 1 and failover_ms a list of
that many positive numbers; bound_ms a positive integer, bound_what text;
max_us >= p50_us > 0; target_met a boolean, true exactly when every
failover is within the bound (ceiling_p50_us).
Peer rows (--peers): only under uncontended, handoff, semaphore, rwlock or
elect-failover, never on the local engine, each right after Cerberus's row
(or another peer's) of the same scenario, engine and threads; peer_status
measured, skipped or failed; compared "ops_per_s" (uncontended, semaphore,
rwlock) or "p50_us" (handoff, elect-failover); a row "none" (no peer for
this engine and primitive) is skipped with a reason starting "no peer". Measured: the
figures are numbers (ops_per_s > 0), peer_reason null, cerberus_over_peer a
positive number or null, cerberus_over_peer_p99 null on uncontended;
target null or text, target_met a boolean exactly when a target is there.
Skipped or failed: peer_reason a non-empty string and every figure null.

--engine E       every row is on engine E
--peer-rows      none: no peer rows (e.g. the local engine, or no --peers);
                 some: at least one; any (default): either
--peer-status S  the statuses allowed (default all three); repeatable
Prints "# <problem>" lines; exit status 1 when there is any.
"""
import json
import sys

CORE_FIGURES = ("wakeups_per_acq", "calls_per_acq", "cpu_percent", "bytes_per_lock")
PEER_STATUSES = ("measured", "skipped", "failed")
GUARD_SCENARIOS = ("guard", "guard-dup")
PEER_SCENARIOS = ("uncontended", "handoff", "semaphore", "rwlock", "elect-failover")
BY_OPS = ("uncontended", "semaphore", "rwlock")


def num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_cerberus(r, where, errors):
    if "note" in r:  # failover findings: words, not figures
        if not isinstance(r["note"], str) or not r["note"]:
            errors.append("%s: note is not a non-empty string" % where)
        return
    for k in ("ops_per_s", "p50_us", "p99_us", "max_us"):
        if not num(r.get(k)) or r[k] < 0:
            errors.append("%s: %s is not a number >= 0" % (where, k))
    if num(r.get("ops_per_s")) and r["ops_per_s"] <= 0:
        errors.append("%s: ops_per_s is 0" % where)
    if "ratio" not in r or not (r["ratio"] is None or num(r["ratio"])):
        errors.append("%s: ratio is not a number or null" % where)
    for k in CORE_FIGURES:
        if k not in r or not (r[k] is None or num(r[k])):
            errors.append("%s: %s is missing or not a number or null" % (where, k))
    if r.get("scenario") in GUARD_SCENARIOS:
        check_guard(r, where, errors)
    if r.get("scenario") == "switch":
        check_switch(r, where, errors)
    if r.get("scenario") == "semaphore":
        n = r.get("permits")
        if not isinstance(n, int) or isinstance(n, bool) or n < 1 or r.get("threads") != 2 * n:
            errors.append("%s: permits %r / threads %r (2 x permits)"
                          % (where, n, r.get("threads")))
    if r.get("scenario") == "rwlock":
        rd, wr = r.get("reads"), r.get("writes")
        if not isinstance(rd, int) or not isinstance(wr, int) or (rd > 20 and wr <= 0):
            errors.append("%s: reads %r / writes %r" % (where, rd, wr))
        for k in ("read_p50_us", "write_p50_us"):
            if not num(r.get(k)):
                errors.append("%s: %s is not a number" % (where, k))
    if r.get("scenario") == "elect-failover":
        check_elect(r, where, errors)


def check_elect(r, where, errors):
    if r.get("ceiling_kind") != "bound":
        errors.append("%s: ceiling_kind %r is not \"bound\"" % (where, r.get("ceiling_kind")))
    k, rounds, fo = r.get("candidates"), r.get("rounds"), r.get("failover_ms")
    if not isinstance(k, int) or k < 2 or k != r.get("threads"):
        errors.append("%s: candidates %r (threads %r)" % (where, k, r.get("threads")))
    if not isinstance(rounds, int) or rounds < 1 or not isinstance(fo, list) \
            or len(fo) != rounds or not all(num(x) and x > 0 for x in fo):
        errors.append("%s: rounds %r / failover_ms %r" % (where, rounds, fo))
        return
    b = r.get("bound_ms")
    if not isinstance(b, int) or b <= 0 or not isinstance(r.get("bound_what"), str):
        errors.append("%s: bound_ms %r / bound_what %r" % (where, b, r.get("bound_what")))
        return
    if not (num(r.get("p50_us")) and num(r.get("max_us")) and 0 < r["p50_us"] <= r["max_us"]):
        errors.append("%s: p50_us %r / max_us %r" % (where, r.get("p50_us"), r.get("max_us")))
    within = all(x * 1e3 <= r.get("ceiling_p50_us", 0) for x in fo)
    if r.get("target_met") is not within:
        errors.append("%s: target_met %r, yet every failover within the bound is %r"
                      % (where, r.get("target_met"), within))


def check_switch(r, where, errors):
    if r.get("ceiling_kind") != "alone":
        errors.append("%s: ceiling_kind %r is not \"alone\"" % (where, r.get("ceiling_kind")))
    a = r.get("alone_ops_per_s")
    if not num(a) or a <= 0 or a != r.get("ceiling_ops_per_s"):
        errors.append("%s: alone_ops_per_s %r is not the positive ceiling_ops_per_s" % (where, a))
    if not num(r.get("ratio")) or r["ratio"] <= 0:
        errors.append("%s: ratio %r is not a positive number" % (where, r.get("ratio")))
    engines = r.get("engines")
    if not isinstance(engines, list) or len(engines) < 2 or r.get("engine") not in engines \
            or r.get("from") not in engines:
        errors.append("%s: engines %r / from %r" % (where, engines, r.get("from")))
    for k in ("epoch_before", "epoch_after", "lease_ms", "hold_ms", "settle_ms", "busy",
              "busy_alone", "gate_questions"):
        if not isinstance(r.get(k), int) or isinstance(r.get(k), bool):
            errors.append("%s: %s %r is not an integer" % (where, k, r.get(k)))
    if r.get("target_min") != 0.9 or not isinstance(r.get("target_met"), bool):
        errors.append("%s: target_min %r / target_met %r" % (where, r.get("target_min"),
                                                             r.get("target_met")))


def check_guard(r, where, errors):
    for k in ("server_cmds_per_op", "ceiling_server_cmds_per_op", "ceiling_missing"):
        if k not in r:
            errors.append("%s: %s is missing" % (where, k))
    missing, ratio = r.get("ceiling_missing"), r.get("ratio")
    if missing is None:
        if not num(ratio) or ratio <= 0:
            errors.append("%s: a ceiling, yet ratio %r is not a positive number" % (where, ratio))
        c = r.get("ceiling_ops_per_s")
        if not num(c) or c <= 0:
            errors.append("%s: ceiling_ops_per_s %r is not a positive number" % (where, c))
    else:
        if not isinstance(missing, str) or not missing.startswith("no ceiling for engine "):
            errors.append("%s: ceiling_missing %r is not \"no ceiling for engine ...\""
                          % (where, missing))
        if ratio is not None:
            errors.append("%s: no ceiling, yet ratio is %r" % (where, ratio))
    cmds = r.get("server_cmds_per_op")
    for k in ("server_cmds_per_op", "ceiling_server_cmds_per_op"):
        v = r.get(k)
        if not (v is None or (num(v) and v > 0)):
            errors.append("%s: %s %r is not a positive number or null" % (where, k, v))
    if (cmds is None) != (r.get("ceiling_server_cmds_per_op") is None):
        errors.append("%s: server_cmds_per_op and ceiling_server_cmds_per_op: one is null"
                      % where)
    if cmds is not None and missing is not None:
        errors.append("%s: server_cmds_per_op without a ceiling to count them" % where)


def check_peer(r, where, errors, allowed):
    st = r.get("peer_status")
    if st not in PEER_STATUSES:
        errors.append("%s: peer_status %r is not one of %s" % (where, st, PEER_STATUSES))
        return
    if st not in allowed:
        errors.append("%s: peer_status %r (%s) is not allowed here (%s)"
                      % (where, st, r.get("peer_reason"), ", ".join(allowed)))
    if r.get("scenario") not in PEER_SCENARIOS:
        errors.append("%s: a peer row under scenario %r" % (where, r.get("scenario")))
    if r.get("engine") == "local":
        errors.append("%s: a peer row on the local engine" % where)
    if r.get("peer") == "none" and (st != "skipped" or
                                    not str(r.get("peer_reason")).startswith("no peer")):
        errors.append("%s: a \"none\" row must be skipped with \"no peer: ...\"" % where)
    want = "ops_per_s" if r.get("scenario") in BY_OPS else "p50_us"
    if r.get("compared") != want:
        errors.append("%s: compared is %r, expected %r" % (where, r.get("compared"), want))
    for k in ("peer_reason", "peer_how", "cerberus_over_peer",
              "cerberus_over_peer_p99", "target", "target_met", "ratio"):
        if k not in r:
            errors.append("%s: %s is missing" % (where, k))
    if r.get("ratio") is not None:
        errors.append("%s: ratio (to the raw ceiling) must be null on a peer row" % where)
    if st == "measured":
        for k in ("ops_per_s", "p50_us", "p99_us", "max_us"):
            if not num(r.get(k)) or r[k] < 0:
                errors.append("%s: %s is not a number >= 0" % (where, k))
        if num(r.get("ops_per_s")) and r["ops_per_s"] <= 0:
            errors.append("%s: ops_per_s is 0" % where)
        if r.get("peer_reason") is not None:
            errors.append("%s: measured, yet peer_reason is %r" % (where, r["peer_reason"]))
        c = r.get("cerberus_over_peer")
        if not (c is None or (num(c) and c > 0)):
            errors.append("%s: cerberus_over_peer %r is not a positive number or null" % (where, c))
        c99 = r.get("cerberus_over_peer_p99")
        if r.get("scenario") in BY_OPS and c99 is not None:
            errors.append("%s: cerberus_over_peer_p99 must be null on uncontended" % where)
        if not (c99 is None or (num(c99) and c99 > 0)):
            errors.append("%s: cerberus_over_peer_p99 %r is not a positive number or null"
                          % (where, c99))
        t, met = r.get("target"), r.get("target_met")
        if not (t is None or (isinstance(t, str) and t)):
            errors.append("%s: target %r is not text or null" % (where, t))
        if t is None and met is not None:
            errors.append("%s: target_met %r without a target" % (where, met))
        if t is not None and c is not None and not isinstance(met, bool):
            errors.append("%s: target_met %r is not a boolean" % (where, met))
    else:
        if not isinstance(r.get("peer_reason"), str) or not r["peer_reason"]:
            errors.append("%s: %s without a peer_reason" % (where, st))
        for k in ("ops_per_s", "p50_us", "p99_us", "max_us", "cerberus_over_peer",
                  "cerberus_over_peer_p99", "target_met"):
            if r.get(k) is not None:
                errors.append("%s: %s, yet %s is %r (must be null)" % (where, st, k, r[k]))


def check(rows, engine=None, peer_rows="any", allowed=PEER_STATUSES):
    errors = []
    if not isinstance(rows, list) or not rows:
        return ["the JSON is not a non-empty array"]
    last_cerb = None
    n_peer = 0
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            errors.append("object %d is not an object" % i)
            continue
        where = "object %d (%s %s%s)" % (i, r.get("scenario"), r.get("engine"),
                                         " peer " + str(r.get("peer")) if r.get("peer") else "")
        for k in ("scenario", "engine"):
            if not isinstance(r.get(k), str) or not r[k]:
                errors.append("%s: %s is not a non-empty string" % (where, k))
        th = r.get("threads")
        if not isinstance(th, int) or isinstance(th, bool) or th < 1:
            errors.append("%s: threads is not a positive integer" % where)
        if engine is not None and r.get("engine") != engine:
            errors.append("%s: engine is %r, not %s" % (where, r.get("engine"), engine))
        if "peer" not in r:
            errors.append("%s: the peer key is missing" % where)
            continue
        p = r["peer"]
        if p is None:
            check_cerberus(r, where, errors)
            last_cerb = r
            continue
        n_peer += 1
        if not isinstance(p, str) or not p:
            errors.append("%s: peer is not null or a non-empty string" % where)
        check_peer(r, where, errors, allowed)
        if last_cerb is None or any(last_cerb.get(k) != r.get(k)
                                    for k in ("scenario", "engine", "threads")):
            errors.append("%s: not right after Cerberus's row of the same scenario, "
                          "engine and threads" % where)
    if peer_rows == "none" and n_peer:
        errors.append("%d peer rows, expected none" % n_peer)
    if peer_rows == "some" and not n_peer:
        errors.append("no peer rows, expected some")
    return errors


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    path, engine, peer_rows, allowed = argv[0], None, "any", []
    args = argv[1:]
    while args:
        a = args.pop(0)
        if a == "--engine" and args:
            engine = args.pop(0)
        elif a == "--peer-rows" and args and args[0] in ("none", "some", "any"):
            peer_rows = args.pop(0)
        elif a == "--peer-status" and args and args[0] in PEER_STATUSES:
            allowed.append(args.pop(0))
        else:
            print(__doc__, file=sys.stderr)
            return 2
    try:
        with open(path) as f:
            rows = json.load(f)
    except (OSError, ValueError) as e:
        print("# cannot read the JSON: %s" % e)
        return 1
    errors = check(rows, engine, peer_rows, tuple(allowed) or PEER_STATUSES)
    for e in errors:
        print("# " + e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
