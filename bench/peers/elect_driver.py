#!/usr/bin/python3
"""elect_driver.py — the elect-failover measurement (peerlib.elect_failover)
for a peer whose candidates are a command line, such as Curator's
LeaderLatch in a JVM (bench/peers/curator.sh runs it).

usage: elect_driver.py --peer NAME --how TEXT --threads K --rounds R
                       --lease-ms L [--no-stamps] -- CMD [ARG...]

Each candidate is CMD with "{idx}" in its arguments replaced by its number;
it prints "ready I" and "elected I T" (peerlib.py), or with --no-stamps
any first line once it leads, stamped when read. Prints the one result
line of the peer protocol; errors on stderr with exit status 1.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peerlib  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--peer", required=True)
    p.add_argument("--how", required=True)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--rounds", type=int, required=True)
    p.add_argument("--lease-ms", type=int, required=True)
    p.add_argument("--no-stamps", action="store_true")
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    a = p.parse_args()
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        peerlib.fail("no candidate command")
    a.scenario = "elect-failover"
    a.duration = 0
    peerlib.elect_failover(a, lambda i: [w.replace("{idx}", str(i)) for w in cmd],
                           a.peer, a.how, stamps=not a.no_stamps)


if __name__ == "__main__":
    peerlib.main(main)
